"""Settings of the running service, read once at start (a reload keeps their running
values: docs/reload.md): limits, observations, telemetry and its traces, sessions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sidecar.config.fields import PositiveFloat, PositiveInt, SecretSource, StrictModel, bounded


class Sessions(StrictModel):
    """Stateful Chat-to-Responses sessions (docs/dialects.md §13)."""

    ttl_seconds: Annotated[PositiveInt, bounded(1, 30 * 86_400)] = 3600
    max_entries: Annotated[PositiveInt, bounded(1, 10_000_000)] = 10_000


class Limits(StrictModel):
    """Request limits enforced by Envoy and the sidecar."""

    max_request_body_bytes: Annotated[PositiveInt, bounded(1, 1024**3)] = 32 * 1024 * 1024
    request_timeout_seconds: Annotated[PositiveFloat, bounded(0.001, 86_400)] = 600.0
    sidecar_message_timeout_ms: Annotated[PositiveInt, bounded(1, 60_000)] = 2000
    # Envoy's overload manager refuses client connections beyond this many (all listeners).
    max_client_connections: Annotated[PositiveInt, bounded(1, 10_000_000)] = 10_000


class Observations(StrictModel):
    """How the sidecar learns from responses (docs/observations.md)."""

    enabled: bool = True
    flush_interval_ms: Annotated[PositiveInt, bounded(10, 60_000)] = 250
    slice_seconds: Annotated[PositiveInt, bounded(1, 3_600)] = 10
    refresh_ms: Annotated[PositiveInt, bounded(1, 60_000)] = 1000
    # A provider's 429 that names a wait (`retry-after`, its rate-limit reset headers) keeps
    # the target out of decisions for that long, at most this; 0 ignores what they say.
    max_retry_after_seconds: Annotated[float, Field(ge=0.0, le=3_600.0)] = 60.0


class Traces(StrictModel):
    """OpenTelemetry spans of routed requests, sent over OTLP/HTTP (docs/telemetry.md §5)."""

    otlp_endpoint: str
    service_name: str = "model-group-sidecar"
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0

    @field_validator("otlp_endpoint")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("an http(s) URL, e.g. http://127.0.0.1:4318/v1/traces")
        return value


class Telemetry(StrictModel):
    """Joined request rows and fallback rows (docs/telemetry.md). Off until a store is set:
    `sqlite_path` for one sidecar, `postgres_dsn` (a secret: it may hold a password) for
    several replicas writing one database."""

    sqlite_path: Path | None = None
    postgres_dsn: SecretSource | None = None
    queue_size: Annotated[PositiveInt, bounded(1, 10_000_000)] = 10_000
    max_pending: Annotated[PositiveInt, bounded(1, 10_000_000)] = 65_536
    # Decisions and access-log results the sidecar holds for its telemetry worker
    # (marshalled, ~250 bytes each: 100,000 is at most ~25 MB).
    handoff_size: Annotated[PositiveInt, bounded(1, 10_000_000)] = 100_000
    # background: the worker runs only on CPU the request path leaves idle (SCHED_IDLE);
    # normal: at the sidecar's own priority.
    worker_priority: Literal["background", "normal"] = "background"
    replica: str = ""
    # Raw rows older than this are deleted once their day is rolled up; rollups stay.
    raw_retention_days: Annotated[PositiveInt, bounded(1, 36_500)] = 30
    rollup_interval_minutes: Annotated[PositiveInt, bounded(1, 1_440)] = 60
    traces: Traces | None = None

    @model_validator(mode="after")
    def _one_store(self) -> Telemetry:
        if self.sqlite_path is not None and self.postgres_dsn is not None:
            raise ValueError("set one of 'sqlite_path' or 'postgres_dsn', not both")
        if self.traces is not None and not self.enabled:
            raise ValueError("'traces' are built from the joined rows: set 'sqlite_path' or "
                             "'postgres_dsn' too")
        return self

    @property
    def enabled(self) -> bool:
        return self.sqlite_path is not None or self.postgres_dsn is not None
