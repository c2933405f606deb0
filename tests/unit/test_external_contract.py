"""The external routing API's string values, three ways: what the sidecar sends
(sidecar/external/query.py), what router.proto's comments promise, and what docs/external.md
lists. A service author reads the proto or the doc and matches on exact strings, so the three
must name the same keys and the same values.

What the code can send is found by running `QueryBuilder` itself: over every dialect and
every state of each request field the shape buckets read (tools absent, offered, forced;
each structured-output kind the dialect parser recognises; output caps and prompt sizes
swept densely from 1 to 10^8), plus the enums behind the other fields (`Dialect`,
`Complexity`, `PromptFeature`). Nothing here restates a value by hand."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path

from sidecar.config import load_config_text
from sidecar.config.policy import Complexity, PromptFeature
from sidecar.dialects.apis import Dialect
from sidecar.dialects.shape import STRUCTURED_OUTPUT_KINDS
from sidecar.external.query import QueryBuilder
from sidecar.external.v1.router_pb2 import RankRequest
from sidecar.routing.observations import ObservationSnapshot
from sidecar.routing.request import Reasoning, RequestSummary

ROOT = Path(__file__).resolve().parents[2]
PROTO = (ROOT / "proto/sidecar/external/v1/router.proto").read_text()
DOC = (ROOT / "docs/external.md").read_text()

GROUP = """
models:
  g:
    strategy: external
    targets: [{provider: openai, model_ref: m}]
    external: {url: 'grpc://127.0.0.1:9'}
"""
NO_COMPLEXITY = GROUP + """
    routing_policy: {dynamic_score: {signals: {complexity: {enabled: false}}}}
"""


def _sizes() -> list[int]:
    """1 to 10^8: every integer up to 256, then steps of at most 2 % (so any bucket wider
    than that is hit at least once)."""
    sizes, value = list(range(1, 257)), 256.0
    while value < 1e8:
        value *= 1.02
        sizes.append(int(value))
    return sizes


def _requests() -> Iterator[RequestSummary]:
    """One base request per dialect, varied one field at a time: each shape bucket reads
    its own fields only, so this reaches every value each bucket can take."""
    for dialect in Dialect:
        base = RequestSummary(group="g", caller="c", dialect=dialect)
        yield base
        yield replace(base, stream=True)
        yield replace(base, has_tools=True)
        yield replace(base, has_tools=True, tool_forced=True)
        yield replace(base, has_images=True)
        yield replace(base, reasoning=Reasoning(effort="high"))
        yield replace(base, reasoning=Reasoning(budget_tokens=2048))
        for kind in STRUCTURED_OUTPUT_KINDS:
            yield replace(base, structured_output=kind)
        for size in _sizes():
            yield replace(base, max_tokens_cap=size, prompt_chars=size)


@cache
def sent_values() -> dict[str, set[str]]:
    """Field (or `request_shape.<key>`) → every value the sidecar can put there."""
    values: dict[str, set[str]] = defaultdict(set)
    for text in (GROUP, NO_COMPLEXITY):
        ask = QueryBuilder(load_config_text(text).models["g"])
        for request in _requests():
            query = ask(request, [], ObservationSnapshot({}))
            values["api"].add(query.api)
            values["complexity"].add(query.complexity)
            for key, value in query.request_shape.items():
                values[f"request_shape.{key}"].add(value)
    # The scan finds features in prompt text, so these come from the enums the query's
    # values are made of (`query.py`: `f.value for f in features`, `level.bucket.value`).
    values["prompt_features"] = {feature.value for feature in PromptFeature}
    assert values["complexity"] <= {level.value for level in Complexity} | {""}
    assert values["api"] == {dialect.value for dialect in Dialect}
    return dict(values)


# --- router.proto -------------------------------------------------------------------------

def _comment_above(field: str) -> str:
    """The `//` comment lines right above a field of RankRequest, joined."""
    lines = PROTO[:PROTO.index(f" {field} = ")].splitlines()[:-1]
    comment: list[str] = []
    while lines and lines[-1].strip().startswith("//"):
        comment.insert(0, lines.pop().strip().removeprefix("//"))
    assert comment, f"router.proto: no comment above {field}"
    return " ".join(comment)


def _quoted(text: str) -> set[str]:
    return set(re.findall(r'"([^"]*)"', text))


def proto_values() -> dict[str, set[str]]:
    values = {field: _quoted(_comment_above(field))
              for field in ("api", "complexity", "prompt_features")}
    # `"key": "value", "value" or "value"` entries, one a line; the text before the first
    # entry is prose.
    _, *entries = re.split(r'"(\w+)":', _comment_above("request_shape"))
    for key, text in zip(entries[::2], entries[1::2], strict=True):
        values[f"request_shape.{key}"] = _quoted(text)
    return values


def test_router_proto_comments_list_exactly_what_the_sidecar_sends() -> None:
    assert proto_values() == sent_values()


# --- docs/external.md ---------------------------------------------------------------------

def _table(header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with `header`, split into cells
    (`\\|` is a pipe inside a cell)."""
    lines = DOC.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def _code_spans(cell: str) -> list[str]:
    """The `code` spans of a cell; `""` stands for the empty string."""
    return [span.replace('""', "") for span in re.findall(r"`([^`]*)`", cell)]


def doc_values() -> dict[str, set[str]]:
    values: dict[str, set[str]] = {}
    for fields, listed, _meaning in _table("| field | values |"):
        for field in _code_spans(fields):
            assert field not in values, f"docs/external.md lists {field} twice"
            values[field] = set(_code_spans(listed))
    return values


def test_external_md_lists_exactly_what_the_sidecar_sends() -> None:
    assert doc_values() == sent_values()


def test_external_md_names_every_field_of_the_request() -> None:
    documented = {name.removesuffix("[]") for fields, _ in _table("| field | content |")
                  for name in _code_spans(fields)}
    assert documented == {field.name for field in RankRequest.DESCRIPTOR.fields}


def test_external_md_names_every_request_shape_key() -> None:
    """The field table's short list of shape keys is the same list."""
    (row,) = [cells for cells in _table("| field | content |") if cells[0] == "`request_shape`"]
    listed = set(_code_spans(row[1].split(")")[0]))
    assert listed == {key.removeprefix("request_shape.") for key in sent_values()
                      if key.startswith("request_shape.")}
