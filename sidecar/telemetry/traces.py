"""OpenTelemetry spans of routed requests (docs/telemetry.md §5), optional and off by default.

One span per joined request row, made in the telemetry worker process when the row is made
with the request's own start and end times, parented on the W3C `traceparent` the request
carried (checked in rows.py). Attributes follow the GenAI semantic conventions plus the
decision's buckets; like the rows, they are configuration names, bucket names and numbers,
never prompt text. The SDK's batch processor exports over OTLP/HTTP (JSON encoding,
otlp_json.py) from its own thread, with a bounded queue that drops rather than waits.

Needs the `otel` extra: `pip install 'model-group-sidecar[otel]'`.
"""

from __future__ import annotations

from typing import Any

from sidecar.config.service_settings import Traces
from sidecar.telemetry.rows import RequestRow

MAX_QUEUED_SPANS = 4096


class TracesUnavailable(OSError):
    pass


class RequestSpans:
    @staticmethod
    def check_available() -> None:
        """Raise TracesUnavailable now when the `otel` extra is missing (the spans are made
        in the telemetry worker, whose errors are only logged)."""
        try:
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            raise TracesUnavailable("telemetry.traces needs OpenTelemetry: pip install "
                                    "'model-group-sidecar[otel]'") from None

    def __init__(self, settings: Traces, exporter: Any = None) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise TracesUnavailable("telemetry.traces needs OpenTelemetry: pip install "
                                    "'model-group-sidecar[otel]'") from None
        if exporter is None:
            from sidecar.telemetry.otlp_json import OtlpJsonExporter

            exporter = OtlpJsonExporter(settings.otlp_endpoint)
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
        self._processor = BatchSpanProcessor(exporter, max_queue_size=MAX_QUEUED_SPANS)
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("model-group-sidecar")
        self._propagator = TraceContextTextMapPropagator()

    def record(self, row: RequestRow) -> None:
        """A span for one routed request (log-only rows, with no decision, make none)."""
        if not row.strategy:
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        parent = (self._propagator.extract({"traceparent": row.traceparent})
                  if row.traceparent else None)
        start = int(row.started_at * 1e9)
        end = start + int((row.latency_ms or 0.0) * 1e6)
        span = self._tracer.start_span(f"chat {row.group}", context=parent,
                                       kind=SpanKind.CLIENT, start_time=start,
                                       attributes=span_attributes(row))
        if row.status_class not in ("2xx", "unknown"):
            span.set_status(Status(StatusCode.ERROR, row.error_class or row.status_class))
        span.end(end_time=end)

    def flush(self, timeout_s: float = 5.0) -> None:
        self._provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self._provider.shutdown()


def span_attributes(row: RequestRow) -> dict[str, Any]:
    serving = row.serving_target or row.selected_target or ""
    provider, _, model = serving.partition("/")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": row.group,
        "gen_ai.response.model": model,
        "gen_ai.provider.name": provider,
        "sidecar.strategy": row.strategy,
        "sidecar.selected_target": row.selected_target or "",
        "sidecar.affinity": row.affinity,
        "sidecar.candidates": row.candidate_count,
        "sidecar.join": row.join,
    }
    optional = {
        "gen_ai.usage.input_tokens": row.input_tokens,
        "gen_ai.usage.output_tokens": row.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": row.cached_tokens,
        "gen_ai.usage.cache_creation.input_tokens": row.cache_write_tokens,
        "http.response.status_code": row.status,
        "error.type": row.error_class if row.error_class not in (None, "ok") else None,
        "sidecar.complexity": row.complexity,
        "sidecar.cold_start": row.cold_start,
        "sidecar.attempts": row.attempts,
        "sidecar.cost_usd": row.cost_usd,
        "sidecar.ttfb_ms": row.ttfb_ms,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    return attributes
