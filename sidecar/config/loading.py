"""Turn YAML text into a validated `SidecarConfig`, or into a list of problems with YAML paths.

Every problem is reported at once (not just the first) as ``path: message`` so that
`sidecar check-config` reads like a to-do list for the operator. The layers run one after
the other, each as far as the one before allows: the YAML (a syntax error ends the read,
and is given with the parser's reason and the path of where it stopped), every field
(pydantic), then the cross-references (references.py) over whatever validated, so one bad
place hides nothing elsewhere. Values are never echoed for string fields, because a
misplaced token or key must not end up in a terminal or CI log.
"""

from __future__ import annotations

import ctypes
import difflib
import os
import stat
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sidecar.config.models import SidecarConfig
from sidecar.config.problems import ConfigError, ConfigProblem
from sidecar.config.references import (
    ConfigView,
    config_view,
    reference_problems,
    salvaged_view,
)


@dataclass(frozen=True)
class CheckedConfig:
    """A configuration's check: the configuration when nothing is wrong with it, what of it
    validated (for the checks after these: secrets), and every problem found."""

    config: SidecarConfig | None
    view: ConfigView | None          # None when there is nothing to look at (unreadable)
    problems: tuple[ConfigProblem, ...]


# The largest configuration file read (a configuration of 10,000 targets is about 2 MB):
# a larger one is refused before it is parsed, so no file can make a reload hold more.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# The most YAML events (each scalar, alias and collection start or end) a configuration may
# hold, counted before anything is built: a file at the size cap made of small values took
# 40 s to load; this many take at most about 4.5 s on a 2-core machine (PyYAML builds each
# value in Python), and a configuration of 10,000 targets has about 160,000.
MAX_CONFIG_EVENTS = 250_000
# libyaml's loader where PyYAML has it: several times faster on a large file.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TOO_DEEP = "nested too deeply (more levels than the parser allows)"


def load_config_file(path: str | Path) -> SidecarConfig:
    path = Path(path)
    return load_config_text(read_config_file(path), source=str(path))


def read_config_file(path: Path) -> str:
    """The file's text. Only a regular file is read (a FIFO or a device, which may never
    end, would hold every reload path), at most MAX_CONFIG_BYTES; opening never blocks."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _unreadable(path, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise _unreadable(path, "not a regular file")
    with os.fdopen(descriptor, "rb") as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise _unreadable(path, f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _unreadable(path, "not UTF-8 text") from None


def _unreadable(path: Path, why: str) -> ConfigError:
    return ConfigError([ConfigProblem("", f"cannot read {path}: {why}")], str(path))


def load_config_text(text: str, source: str = "configuration") -> SidecarConfig:
    return _loaded(check_config_text(text), source)


def check_config_text(text: str) -> CheckedConfig:
    try:
        _within_event_budget(text)
        data = yaml.load(text, Loader=_LOADER)
        _within_expanded_budget(data)
    except yaml.YAMLError as exc:
        return _unusable(ConfigProblem(_path_where_parsing_stops(text), _yaml_message(exc)))
    except RecursionError:
        return _unusable(ConfigProblem("", _TOO_DEEP))
    except _OverBudget as exc:
        return _unusable(ConfigProblem("", str(exc)))
    finally:
        release_freed_memory()
    return check_config_data(data)


def _unusable(problem: ConfigProblem) -> CheckedConfig:
    return CheckedConfig(None, None, (problem,))


def _yaml_message(exc: yaml.YAMLError) -> str:
    """Where the parser stopped and, in its own words, why (the words name the kind of
    mistake, never a value): `did not find expected key (in the block mapping that starts
    at line 5, column 5)`, the usual sign of a line indented wrongly."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    why = getattr(exc, "problem", None)
    why = f": {why}" if isinstance(why, str) and why else ""
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if why and isinstance(context, str) and context.startswith("while parsing a ") and start:
        what = context.removeprefix("while parsing a ")
        why += f" (in the {what} that starts at line {start.line + 1}, column {start.column + 1})"
    return f"not valid YAML{where}{why}"


class _OverBudget(Exception):
    """A configuration larger than the loader takes (its message says which bound)."""


def _path_where_parsing_stops(text: str) -> str:
    """The dotted path of the block the parser was in when it stopped. Only a file that
    failed is read again for this (as far as the first reading got), so a valid one pays
    nothing; "" when the parser read it all (the mistake was found later, or at the top)."""
    position = _Position()
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            position.see(event)
    except yaml.YAMLError:
        pass
    return position.path


class _Position:
    """The dotted path of the node the YAML event stream is at, kept up to date event by
    event."""

    def __init__(self) -> None:
        # Per open collection: its path, and the key of a mapping whose value comes next
        # (None while a key is expected) or the next index of a sequence.
        self._open: list[tuple[str, str | int | None]] = []

    @property
    def path(self) -> str:
        if not self._open:
            return ""
        path, step = self._open[-1]
        if isinstance(step, str):  # the key was read: the error is in its value
            return _join(path, step)
        return path

    def see(self, event: yaml.Event) -> None:
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            self._open.append((self._child_path(), None if isinstance(
                event, yaml.MappingStartEvent) else 0))
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            self._open.pop()
            self._done()
        elif isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
            if self._open and self._open[-1][1] is None:  # a mapping's key
                key = event.value if isinstance(event, yaml.ScalarEvent) else "*"
                self._open[-1] = (self._open[-1][0], key)
            else:
                self._done()

    def _child_path(self) -> str:
        if not self._open:
            return ""
        path, step = self._open[-1]
        if step is None:  # a collection as a mapping key: rare, and has no dotted name
            return _join(path, "?")
        return _join(path, step)

    def _done(self) -> None:
        """A value ended: its mapping expects a key again, its sequence the next item."""
        if not self._open:
            return
        path, step = self._open[-1]
        self._open[-1] = (path, step + 1 if isinstance(step, int) else None)


def _join(path: str, step: str | int) -> str:
    if isinstance(step, int):
        return f"{path}[{step}]"
    return f"{path}.{step}" if path else step


def _within_event_budget(text: str) -> None:
    """The event stream is read without building anything (no recursion, nothing held), so
    the count bounds the time and memory of the load that follows."""
    for count, _event in enumerate(yaml.parse(text, Loader=_LOADER), 1):
        if count > MAX_CONFIG_EVENTS:
            raise _OverBudget(f"more than {MAX_CONFIG_EVENTS:,} YAML values (keys, values "
                              "and collections)")


def _within_expanded_budget(data: Any) -> None:
    """An alias is one event but stands for its whole anchor, and validation walks every
    use: a 106 KB file of aliases to aliases took 2 GB in 15 s and never ended. So the
    values as validation will see them are counted too, each anchored one once (memo)."""
    sizes: dict[int, int] = {}

    def expanded(value: Any) -> int:
        if isinstance(value, dict):
            children: Any = (*value.keys(), *value.values())
        elif isinstance(value, list):
            children = value
        else:
            return 1
        known = sizes.get(id(value))
        if known is None:
            known = sizes[id(value)] = 1 + sum(expanded(child) for child in children)
            if known > MAX_CONFIG_EVENTS:
                raise _OverBudget(f"more than {MAX_CONFIG_EVENTS:,} YAML values once its "
                                  "aliases are expanded")
        return known

    expanded(data)


def release_freed_memory() -> None:
    """Give the heap a parse freed back to the system (glibc keeps it otherwise: two 10 MB
    parses left the process 140 MB larger for good)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def load_config_data(data: Any, source: str = "configuration") -> SidecarConfig:
    return _loaded(check_config_data(data), source)


def _loaded(checked: CheckedConfig, source: str) -> SidecarConfig:
    if checked.config is None:
        raise ConfigError(checked.problems, source)
    return checked.config


def check_config_data(data: Any) -> CheckedConfig:
    """Validation, then the cross-references: over the whole configuration when it
    validated, else over each part that validates on its own."""
    if not isinstance(data, dict):
        return _unusable(ConfigProblem("", "must be a YAML mapping with a 'models:' key"))
    try:
        try:
            config = SidecarConfig.model_validate(data)
        except ValidationError as exc:
            view = salvaged_view(data)
            problems = [_problem(error) for error in exc.errors()]
            return CheckedConfig(None, view, (*problems, *reference_problems(view)))
    except RecursionError:
        return _unusable(ConfigProblem("", _TOO_DEEP))
    view = config_view(config)
    references = tuple(reference_problems(view))
    return CheckedConfig(None if references else config, view, references)


def _problem(error: Any) -> ConfigProblem:
    location = tuple(error["loc"])
    path = _format_path(location)
    kind = error["type"]
    if kind == "extra_forbidden":
        return ConfigProblem(path, _unknown_key_message(location))
    if kind == "missing":
        return ConfigProblem(path, "is required")
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    elif message.startswith("Input should be"):
        message = "must be" + message[len("Input should be"):]
    elif message.startswith("Input"):
        message = message[0].lower() + message[1:]
    value = error.get("input")
    if isinstance(value, bool | int | float) and kind != "missing":
        message = f"{message} (got {value})"
    return ConfigProblem(path, message)


def _format_path(location: tuple[Any, ...]) -> str:
    """`models.g.targets[0].weight`; a mapping key that is itself wrong (pydantic's
    `[key]` step) is the place of its entry: `models.bad name`."""
    text = ""
    for index, part in enumerate(location):
        if part == "[key]":
            continue
        if isinstance(part, int) and location[index + 1:index + 2] != ("[key]",):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text


def _unknown_key_message(location: tuple[Any, ...]) -> str:
    allowed = _allowed_keys(location[:-1])
    key = str(location[-1])
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown key{hint} (allowed: {', '.join(sorted(allowed))})"


def _allowed_keys(location: tuple[Any, ...]) -> list[str]:
    """Walk the model classes along `location` to list the keys allowed at that point."""
    current: Any = SidecarConfig
    for part in location:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        else:
            args = typing.get_args(current)
            if typing.get_origin(current) is dict and len(args) == 2:
                current = args[1]
            elif typing.get_origin(current) is list and args:
                current = args[0]
            else:
                return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """Strip `X | None` so the walk can continue into X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(options) == 1:
            return options[0]
    return annotation
