"""OpenTelemetry spans from joined rows (docs/telemetry.md §5): GenAI attributes, the
request's own times, parented on a valid traceparent only, never any text."""

from __future__ import annotations

from dataclasses import replace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.config.service_settings import Telemetry, Traces
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import DecisionFacts, DecisionRecord, decision_record, request_row
from sidecar.telemetry.traces import RequestSpans, span_attributes

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def joined(traceparent: str = PARENT, status: int = 200, error: str = "ok"):
    result = RequestResult("r1", status, "good/good-model", 2, error, 850.0, 120.0, 40, 12, 8)
    row = request_row(None, result, {}, "joined", at=1_767_225_600.5)
    return replace(row, group="chat", strategy="dynamic_score", selected_target="flaky/m",
                   complexity="simple", traceparent=traceparent)


def spans_of(*rows, ratio: float = 1.0):
    exporter = InMemorySpanExporter()
    spans = RequestSpans(Traces(otlp_endpoint="http://127.0.0.1:4318/v1/traces",
                                sample_ratio=ratio), exporter)
    for row in rows:
        spans.record(row)
    spans.flush()
    found = exporter.get_finished_spans()
    spans.close()
    return found


def test_a_span_per_routed_request_with_genai_attributes_and_its_own_times() -> None:
    (span,) = spans_of(joined())
    assert span.name == "chat chat"
    attributes = dict(span.attributes)
    assert attributes["gen_ai.request.model"] == "chat"
    assert attributes["gen_ai.response.model"] == "good-model"
    assert attributes["gen_ai.provider.name"] == "good"
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"],
            attributes["gen_ai.usage.cache_read.input_tokens"]) == (40, 12, 8)
    assert attributes["sidecar.selected_target"] == "flaky/m"
    assert attributes["sidecar.attempts"] == 2 and "error.type" not in attributes
    assert span.start_time == 1_767_225_600_500_000_000
    assert span.end_time - span.start_time == 850_000_000
    assert format(span.context.trace_id, "032x") == TRACE
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert span.resource.attributes["service.name"] == "model-group-sidecar"


def test_errors_are_marked_and_log_only_rows_make_no_span() -> None:
    failed, = spans_of(joined(status=502, error="server_error"),
                       replace(joined(), strategy=""))
    assert failed.status.status_code.name == "ERROR"
    assert failed.attributes["error.type"] == "server_error"


@pytest.mark.parametrize("header", [
    "", "garbage", f"01-{TRACE}-00f067aa0ba902b7-01", f"00-{'0' * 32}-00f067aa0ba902b7-01",
    f"00-{TRACE.upper()}-00f067aa0ba902b7-01", f"00-{TRACE}-00f067aa0ba902b7-01-extra",
    "00-CANARY-PROMPT-" + "a" * 38])
def test_only_a_valid_traceparent_is_kept_in_the_row(header: str) -> None:
    from sidecar.routing.decision import NoEligibleTarget

    facts = DecisionFacts("r1", 0.0, "team", "chat", NoEligibleTarget("chat", "none", None),
                          traceparent=header)  # type: ignore[arg-type]
    row = request_row(DecisionRecord(*decision_record(facts)), None, {}, "decision_only")
    assert row.traceparent is None


def test_a_valid_traceparent_is_kept_and_spans_without_one_start_a_trace() -> None:
    from sidecar.routing.decision import NoEligibleTarget

    facts = DecisionFacts("r1", 0.0, "team", "chat", NoEligibleTarget("chat", "none", None),
                          traceparent=PARENT)  # type: ignore[arg-type]
    record = DecisionRecord(*decision_record(facts))
    assert request_row(record, None, {}, "decision_only").traceparent == PARENT
    (span,) = spans_of(joined(traceparent=None))  # type: ignore[arg-type]
    assert span.parent is None


def test_sampling_follows_the_ratio() -> None:
    assert spans_of(*(joined(traceparent=None) for _ in range(20)), ratio=0.0) == ()  # type: ignore[arg-type]


def test_attributes_are_names_and_numbers_only() -> None:
    values = span_attributes(joined()).values()
    assert all(isinstance(v, str | int | float) for v in values)


def test_traces_need_a_store() -> None:
    with pytest.raises(ValueError, match="built from the joined rows"):
        Telemetry(traces=Traces(otlp_endpoint="http://127.0.0.1:4318/v1/traces"))
    with pytest.raises(ValueError, match="http"):
        Traces(otlp_endpoint="127.0.0.1:4318")


def test_spans_are_encoded_in_otlp_json() -> None:
    from sidecar.telemetry.otlp_json import encode

    (span,) = spans_of(joined(status=502, error="server_error"))
    document = encode([span])
    (resource,) = document["resourceSpans"]
    assert {"key": "service.name", "value": {"stringValue": "model-group-sidecar"}} in (
        resource["resource"]["attributes"])
    (encoded,) = resource["scopeSpans"][0]["spans"]
    assert encoded["traceId"] == TRACE and encoded["parentSpanId"] == "00f067aa0ba902b7"
    assert len(encoded["spanId"]) == 16 and encoded["kind"] == 3
    assert encoded["startTimeUnixNano"] == "1767225600500000000"
    assert encoded["status"] == {"code": 2, "message": "server_error"}
    values = {a["key"]: a["value"] for a in encoded["attributes"]}
    assert values["gen_ai.usage.input_tokens"] == {"intValue": "40"}
    assert values["gen_ai.request.model"] == {"stringValue": "chat"}
