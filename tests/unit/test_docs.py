"""docs/configuration.md and the pydantic models of sidecar/config/ name the same keys, in
both directions, and the defaults the page states for the policy's scalar keys are the
model's.

How the page is read: a heading that is one `code` span names a configuration path
(`models.<group>.targets[]`; `<…>` is any map key, `[]` any list item), and every table
whose first column is headed `key` lists paths relative to the heading above it, one or
more `code` spans per key cell (`pricing.input_per_mtok` under `models.<group>.targets[]`
is `models.<group>.targets[].pricing.input_per_mtok`). A heading that names no path (e.g.
"Pricing") may not hold a key table. A block (`hard_filters`) counts as documented when
its keys are; every other field needs a row that names it. The models are walked from
`SidecarConfig` through every field whose type holds a model (optional, list, map or
union)."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from sidecar.config.models import SidecarConfig
from sidecar.config.policy import DynamicScorePolicy
from sidecar.dialects.apis import CALLER_PATHS

ROOT = Path(__file__).parent.parent.parent
DOC = (ROOT / "docs" / "configuration.md").read_text()

ANY_KEY = "<*>"
# One path segment: a field name, then `[]` for a list's items; or `<name>` for a map's keys.
_SEGMENT = re.compile(r"[a-z][a-z0-9_]*(\[\])?|<[a-z_]+>")


# --- the page ------------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    """A table row's cells; `\\|` is a pipe inside a cell."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _path(text: str, where: str) -> str:
    """A documented path, checked and normalised: map keys as `<*>`."""
    segments = text.split(".")
    assert all(_SEGMENT.fullmatch(s) for s in segments), f"{where}: not a key path: {text!r}"
    return ".".join(ANY_KEY if s.startswith("<") else s for s in segments)


def _field(path: str) -> str:
    """The field a path names: `callers[]` and `providers.<*>` are `callers`, `providers`."""
    while path.endswith(("[]", "." + ANY_KEY)):
        path = path.removesuffix("[]").removesuffix("." + ANY_KEY)
    return path


def documented_keys(doc: str) -> dict[str, str]:
    """Every field path the page documents → where (heading or table row) it does so."""
    keys: dict[str, str] = {}
    section: str | None = None
    heading = ""
    in_key_table = in_fence = False
    columns = 0
    for number, line in enumerate(doc.splitlines(), start=1):
        where = f"docs/configuration.md:{number}"
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            named = re.fullmatch(r"`([^`]+)`", heading)
            section = _path(named.group(1), where) if named else None
            if section is not None:
                keys.setdefault(_field(section), where)
            in_key_table = False
            continue
        if not line.startswith("|"):
            in_key_table = False
            continue
        cells = _cells(line)
        if cells[0] == "key":
            assert section is not None, f"{where}: key table under {heading!r}, not a path"
            in_key_table, columns = True, len(cells)
            continue
        if not in_key_table or set(cells[0]) <= {"-", " "}:
            continue
        assert len(cells) == columns, f"{where}: {len(cells)} cells, the header has {columns}"
        spans = re.findall(r"`([^`]+)`", cells[0])
        assert spans and re.fullmatch(r"(`[^`]+`,? ?)+", cells[0]), (
            f"{where}: a key cell holds only `key` spans: {cells[0]!r}")
        for span in spans:
            keys.setdefault(_field(f"{section}.{_path(span, where)}"), where)
    return keys


def with_containers(keys: set[str]) -> set[str]:
    """The keys and every block that holds one: a block such as `hard_filters` is
    documented by the rows of its keys."""
    found = set(keys)
    for key in keys:
        segments = key.split(".")
        found |= {_field(".".join(segments[:end])) for end in range(1, len(segments))}
    return found


# --- the models ----------------------------------------------------------------------------

def _models_in(annotation: object, path: str) -> list[tuple[str, type[BaseModel]]]:
    """The models a field's type holds, each with the path prefix of its fields."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(path, annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0], path)
    if origin in (list, tuple, set, frozenset):
        return [found for arg in args for found in _models_in(arg, path + "[]")]
    if origin is dict:
        return _models_in(args[1], f"{path}.{ANY_KEY}")
    if origin is typing.Literal:
        return []
    return [found for arg in args for found in _models_in(arg, path)]


def model_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field path of `model` and the models its fields hold."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        path = prefix + name
        keys.add(path)
        for inner_path, inner in _models_in(field.annotation, path):
            keys |= model_keys(inner, inner_path + ".")
    return keys


# --- the checks ----------------------------------------------------------------------------

def test_the_page_is_read_as_key_tables() -> None:
    """The reader finds the page's sections: a guard against a parser that reads nothing."""
    found = documented_keys(DOC)
    assert len(found) > 100
    assert "models.<*>.targets[].pricing.input_per_mtok" in found
    assert "models.<*>.routing_policy.dynamic_score.hard_filters.require_input_modalities" in found
    assert "telemetry.traces.sample_ratio" in found and "callers.token_env" not in found


# A model used at a second place is documented once, at its first (the shadow's routing
# policy is the group's `routing_policy` model).
SAME_MODEL_AS = {"models.<*>.shadow.routing_policy": "models.<*>.routing_policy",
                 "models.<*>.rollout.canary.routing_policy": "models.<*>.routing_policy"}


def _documented_at(key: str) -> str:
    for alias, original in SAME_MODEL_AS.items():
        if key.startswith(alias + "."):
            return original + key[len(alias):]
    return key


def test_every_model_field_is_documented() -> None:
    documented = with_containers(set(documented_keys(DOC)))
    missing = sorted(key for key in model_keys(SidecarConfig)
                     if _documented_at(key) not in documented)
    assert missing == [], "fields of sidecar/config/ missing from docs/configuration.md"


def test_every_documented_key_is_a_model_field() -> None:
    fields = model_keys(SidecarConfig)
    unknown = sorted(f"{where}: {path}" for path, where in documented_keys(DOC).items()
                     if path not in fields)
    assert unknown == [], "docs/configuration.md documents keys no model has"


def test_stated_policy_defaults_match_the_model() -> None:
    policy = DynamicScorePolicy()
    for key, value in [("min_observations", policy.min_observations),
                       ("observation_window_seconds", policy.observation_window_seconds),
                       ("max_score_adjustment_percent", int(policy.max_score_adjustment_percent)),
                       ("affinity.ttl_seconds", policy.affinity.ttl_seconds),
                       ("affinity.max_entries", policy.affinity.max_entries),
                       ("signals.prompt_features.max_scan_bytes",
                        policy.signals.prompt_features.max_scan_bytes)]:
        assert f"| `{key}` | `{value}` |" in DOC, key


# --- other pages ---------------------------------------------------------------------------

def test_readme_api_table_is_one_table_naming_every_caller_path() -> None:
    """The table under "API surface" runs unbroken from its header to its last row, and
    lists every path a caller can call."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## API surface", 1)[1].split("\n## ", 1)[0]
    table = section.split("| path |", 1)[1].split("\n\n", 1)[0]
    lines = table.splitlines()[1:]
    assert all(line.startswith("|") for line in lines), "prose inside the API table"
    listed = {path for line in lines for path in re.findall(r"`(?:POST|GET) ([^`]+)`", line)}
    assert {*CALLER_PATHS, "/v1/models", "/v1/models/{group}"} <= listed


def test_cited_tests_exist() -> None:
    """Every `tests/….py` a page cites exists, and a test named right after it
    (`` `tests/x.py`, `test_y` ``) is defined there."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
             ROOT / "proto" / "README.md"]
    for page in pages:
        text = page.read_text()
        for cited in re.findall(r"\btests/[\w/]+\.py\b", text):
            assert (ROOT / cited).is_file(), f"{page.name} cites {cited}, which does not exist"
        for cited, name in re.findall(r"`(tests/[\w/]+\.py)`,\s*`(test_\w+)`", text):
            assert f"def {name}(" in (ROOT / cited).read_text(), f"{page.name}: {cited}::{name}"
