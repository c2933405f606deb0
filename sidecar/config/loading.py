"""Turn YAML text into a validated `SidecarConfig`, or into a list of problems with YAML paths.

Every problem is reported at once (not just the first) as ``path: message`` so that
`sidecar check-config` reads like a to-do list for the operator. Values are never echoed for
string fields, because a misplaced token or key must not end up in a terminal or CI log.
"""

from __future__ import annotations

import ctypes
import difflib
import os
import stat
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sidecar.config.models import SidecarConfig


@dataclass(frozen=True)
class ConfigProblem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """Raised when a configuration cannot be used; carries every problem found."""

    def __init__(self, problems: Sequence[ConfigProblem], source: str = "configuration") -> None:
        self.problems = list(problems)
        self.source = source
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        super().__init__(f"{source} has {len(self.problems)} problem(s):\n{lines}")


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
    try:
        _within_event_budget(text, source)
        data = yaml.load(text, Loader=_LOADER)
        _within_expanded_budget(data, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        # The parser's own words name the kind of mistake, never a value.
        why = getattr(exc, "problem", None)
        why = f": {why}" if isinstance(why, str) and why else ""
        raise ConfigError([ConfigProblem("", f"not valid YAML{where}{why}")], source) from None
    except RecursionError:
        raise ConfigError([ConfigProblem("", _TOO_DEEP)], source) from None
    finally:
        release_freed_memory()
    return load_config_data(data, source)


def _within_event_budget(text: str, source: str) -> None:
    """The event stream is read without building anything (no recursion, nothing held), so
    the count bounds the time and memory of the load that follows."""
    for count, _event in enumerate(yaml.parse(text, Loader=_LOADER), 1):
        if count > MAX_CONFIG_EVENTS:
            raise ConfigError([ConfigProblem("", f"more than {MAX_CONFIG_EVENTS:,} YAML values "
                                                 "(keys, values and collections)")], source)


def _within_expanded_budget(data: Any, source: str) -> None:
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
                raise ConfigError([ConfigProblem("", f"more than {MAX_CONFIG_EVENTS:,} YAML "
                                                     "values once its aliases are expanded")],
                                  source)
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
    if not isinstance(data, dict):
        problem = ConfigProblem("", "must be a YAML mapping with a 'models:' key")
        raise ConfigError([problem], source)
    try:
        config = SidecarConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_problem(error) for error in exc.errors()], source) from None
    except RecursionError:
        raise ConfigError([ConfigProblem("", _TOO_DEEP)], source) from None
    references = config.reference_errors()
    if references:
        raise ConfigError([ConfigProblem(e.path, e.message) for e in references], source)
    return config


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
    text = ""
    for part in location:
        if isinstance(part, int):
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
