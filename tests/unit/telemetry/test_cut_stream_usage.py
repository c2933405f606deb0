"""Usage of a stream cut before its final usage (issue 40): read from the access-log entry
as Envoy leaves it, the row is charged by estimate in both dialects, never 0 or NULL output.

An Anthropic stream says its input in `message_start` (`message.usage.input_tokens`) and
its output only in the final `message_delta`; an OpenAI stream says both in its last
chunk. Cut in between, Envoy's `sse_to_metadata` has left the input alone (Anthropic) or
nothing (OpenAI)."""

from __future__ import annotations

import json

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from google.protobuf import struct_pb2

from sidecar.billing import Rates
from sidecar.devstack import provider_wire
from sidecar.dialects.apis import Dialect
from sidecar.envoy_contract import INPUT_TOKENS_KEY, USAGE_KEY, USAGE_NAMESPACE
from sidecar.observe.entries import result_of
from sidecar.observe.response_checks import SHAPE_KEY
from sidecar.observe.usage_fields import usage_keys
from sidecar.routing.decision import NoEligibleTarget
from sidecar.routing.request import RequestSummary
from sidecar.telemetry.rows import (
    DecisionFacts,
    DecisionRecord,
    decision_record,
    request_row,
)

TARGETS = {"target__g__0__p": "p/m"}
PRICES = {"p/m": Rates(1.0, 10.0, 0.1, 1.25)}
CAP = 64  # the caller's max_tokens: the output budget an estimate charges


def _cut_entry(usage: dict[str, float | str], **flags: bool) -> al.HTTPAccessLogEntry:
    entry = al.HTTPAccessLogEntry()
    common = entry.common_properties
    common.upstream_cluster = "target__g__0__p"
    common.upstream_request_attempt_count = 1
    for name, value in flags.items():
        setattr(common.response_flags, name, value)
    if usage:
        metadata = struct_pb2.Struct()
        metadata.update(usage)
        common.metadata.filter_metadata[USAGE_NAMESPACE].CopyFrom(metadata)
    entry.request.request_id = "r1"
    entry.response.response_code.value = 200
    entry.response.response_headers["content-type"] = "text/event-stream"
    return entry


def _record(dialect: Dialect) -> DecisionRecord:
    summary = RequestSummary("g", "team", dialect, stream=True, max_tokens_cap=CAP,
                             prompt_chars=400)
    facts = DecisionFacts("r1", 0.0, "team", "g", NoEligibleTarget("g", "none", None),
                          summary=summary)  # type: ignore[arg-type]
    return DecisionRecord(*decision_record(facts))


@pytest.mark.parametrize("flags", [{"downstream_remote_reset": True},   # the caller hung up
                                   {"upstream_remote_reset": True}])    # the engine died
@pytest.mark.parametrize(("dialect", "usage", "input_tokens"), [
    (Dialect.ANTHROPIC_MESSAGES, {INPUT_TOKENS_KEY: 37.0, SHAPE_KEY: "message_start"}, 37),
    (Dialect.OPENAI_CHAT, {SHAPE_KEY: "chat.completion.chunk"}, 100),  # 400 chars / 4
])
def test_a_cut_stream_is_charged_its_output_budget_as_estimated(
        flags: dict[str, bool], dialect: Dialect, usage: dict, input_tokens: int) -> None:
    result = result_of(_cut_entry(usage, **flags), TARGETS)
    assert result.output_tokens is None  # nothing said the output
    row = request_row(_record(dialect), result, PRICES, "joined")
    assert row.usage_source == "estimated"
    assert (row.input_tokens, row.output_tokens) == (input_tokens, CAP)
    assert row.cost_usd == pytest.approx((input_tokens * 1.0 + CAP * 10.0) / 1e6)


def test_a_whole_anthropic_stream_stays_reported() -> None:
    usage = {INPUT_TOKENS_KEY: 37.0, "output_tokens": 12.0, SHAPE_KEY: "message_start"}
    row = request_row(_record(Dialect.ANTHROPIC_MESSAGES), result_of(_cut_entry(usage), TARGETS),
                      PRICES, "joined")
    assert (row.usage_source, row.input_tokens, row.output_tokens) == ("reported", 37, 12)


def _read_as_envoy(events: list[bytes]) -> dict[str, float]:
    """The usage keys Envoy's `sse_to_metadata` leaves after these events (each event's
    paths, the last value winning: observation_filters.py)."""
    found: dict[str, float] = {}
    for event in events:
        data = next(line for line in event.decode().splitlines() if line.startswith("data: "))
        found.update(usage_keys(json.loads(data[6:])))
    return found


def test_the_reader_takes_only_the_input_from_an_anthropic_stream_cut_before_message_delta(
        ) -> None:
    completion = provider_wire.make_completion("msg_demo_1", "claude", {"model": "m"}, 400)
    events = list(provider_wire.anthropic_events(completion))
    cut = next(i for i, e in enumerate(events) if e.startswith(b"event: message_delta"))
    before = _read_as_envoy(events[:cut])
    # `message_start` says the input and a provisional `output_tokens: 1`: not the output.
    assert USAGE_KEY not in before and before[INPUT_TOKENS_KEY] == completion.prompt_tokens
    whole = _read_as_envoy(events)
    assert whole[USAGE_KEY] == completion.completion_tokens
    result = result_of(_cut_entry({**before, SHAPE_KEY: "message_start"},
                                  downstream_remote_reset=True), TARGETS)
    row = request_row(_record(Dialect.ANTHROPIC_MESSAGES), result, PRICES, "joined")
    assert (row.usage_source, row.input_tokens, row.output_tokens) == (
        "estimated", completion.prompt_tokens, CAP)


@pytest.mark.parametrize(("relayed", "charged"), [
    (0, CAP),       # nothing reached the caller: only the budget is known
    (1, 1),         # a byte relayed is a token begun
    (101, 26),      # 4 bytes a token, rounded up
    (4 * CAP, CAP),
    (10_000, CAP),  # never above the budget
])
def test_a_cut_stream_is_charged_by_what_was_relayed_up_to_its_budget(relayed: int,
                                                                     charged: int) -> None:
    """Issue 40: a stream the caller cut after a few events was charged its whole cap; what
    Envoy relayed (its body bytes, framing included, so the estimate errs high) says more."""
    entry = _cut_entry({SHAPE_KEY: "chat.completion.chunk"}, downstream_remote_reset=True)
    entry.response.response_body_bytes = relayed
    row = request_row(_record(Dialect.OPENAI_CHAT), result_of(entry, TARGETS), PRICES, "joined")
    assert (row.usage_source, row.output_tokens) == ("estimated", charged)


def test_a_reply_that_is_no_stream_is_charged_its_budget_whatever_its_size() -> None:
    """A JSON body Envoy could not read is most often compressed: its bytes are no measure."""
    entry = _cut_entry({})
    entry.response.response_headers["content-type"] = "application/json"
    entry.response.response_body_bytes = 40
    row = request_row(_record(Dialect.OPENAI_CHAT), result_of(entry, TARGETS), PRICES, "joined")
    assert (row.usage_source, row.output_tokens) == ("estimated", CAP)
