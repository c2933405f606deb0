"""Caller quotas (`callers[].quotas`) and how replicas share their counters (`quotas:`);
docs/quotas.md."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sidecar.config.fields import (
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretSource,
    StrictModel,
    bounded,
)

LIMIT_NAMES = ("requests_per_minute", "tokens_per_day", "spend_per_day_usd")


class QuotaLimits(StrictModel):
    """Limits over UTC windows; unset means unlimited."""

    requests_per_minute: Annotated[PositiveInt, bounded(1, 100_000_000)] | None = None
    tokens_per_day: Annotated[PositiveInt, bounded(1, 10**15)] | None = None
    spend_per_day_usd: Annotated[PositiveFloat, bounded(0.000001, 10**9)] | None = None

    def limits(self) -> list[tuple[str, float]]:
        return [(name, float(value)) for name in LIMIT_NAMES
                if (value := getattr(self, name)) is not None]


class CallerQuotas(QuotaLimits):
    """A caller's limits over all its requests, and over its requests to one group."""

    per_group: dict[str, QuotaLimits] = Field(default_factory=dict)


class QuotaSettings(StrictModel):
    """Process-local counters by default; with `redis_url`, shared across replicas by a
    background reconciliation (never on the request path)."""

    redis_url: SecretSource | None = None
    reconcile_ms: Annotated[PositiveInt, bounded(10, 60_000)] = 100
    # A replica's room past the last total it read, per request limit and round.
    slice_percent: Annotated[PositiveFloat, bounded(0.1, 100)] = 10.0
    key_prefix: str = "sidecar:quota:"
    # With redis_url: how long a request may wait for this replica's next lease when its
    # caller is under the limit but the lease is spent (0: refuse it at once, with the
    # `…_lease_pending` reason). Never longer than Envoy waits for the sidecar.
    lease_wait_ms: Annotated[NonNegativeInt, bounded(0, 10_000)] = 500
