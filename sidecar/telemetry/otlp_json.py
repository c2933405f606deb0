"""An OTLP/HTTP exporter in the protocol's JSON encoding, for the sidecar's spans.

Why not `opentelemetry-exporter-otlp-proto-http`: it needs `opentelemetry-proto`, whose
generated modules share their paths with the older copies inside `xds-protos` (which the
sidecar needs for Envoy's API); whichever package pip installs last wins, and with
`xds-protos` last the exporter fails to import. OTLP/HTTP accepts JSON
(`application/json`, ids as hex strings, 64-bit integers as strings), which needs nothing
but the standard library.

Runs on the SDK's batch-processor thread: blocking I/O with a timeout is fine there.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
          SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


class OtlpJsonExporter(SpanExporter):
    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        self._endpoint = endpoint
        self._timeout = timeout_s

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = json.dumps(encode(spans), separators=(",", ":")).encode()
        request = urllib.request.Request(self._endpoint, data=body, method="POST",
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as answer:
                answer.read()
        except OSError:  # the collector is away: these spans are lost (the SDK logs it)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def encode(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """An `ExportTraceServiceRequest` in OTLP's JSON mapping, spans grouped by resource."""
    by_resource: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
    for span in spans:
        entry = by_resource.setdefault(id(span.resource), (span.resource, []))
        entry[1].append(_span(span))
    return {"resourceSpans": [
        {"resource": {"attributes": _attributes(resource.attributes)},
         "scopeSpans": [{"scope": {"name": "model-group-sidecar"}, "spans": encoded}]}
        for resource, encoded in by_resource.values()]}


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    encoded: dict[str, Any] = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
        "name": span.name,
        "kind": _KINDS.get(span.kind, 1),
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": _attributes(span.attributes or {}),
        "status": {"code": _STATUS[span.status.status_code],
                   **({"message": span.status.description}
                      if span.status.description else {})},
    }
    if span.parent is not None:
        encoded["parentSpanId"] = format(span.parent.span_id, "016x")
    return encoded


def _attributes(attributes: Any) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in attributes.items()]


def _value(value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}
