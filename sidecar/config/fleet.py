"""How replicas of one gateway share what they learn (`fleet:`); docs/fleet.md."""

from __future__ import annotations

from typing import Annotated

from sidecar.config.fields import PositiveInt, SecretSource, StrictModel, bounded


class FleetSettings(StrictModel):
    """Off unless a Redis is named here or for the quotas (`quotas.redis_url`): then every
    replica publishes its observations, ejections, `retry-after` holds, pins and sessions
    each `publish_ms` and merges the others' (a background task, never the request path).
    `enabled: false` keeps a replica to its own evidence while its quotas stay shared."""

    enabled: bool = True
    redis_url: SecretSource | None = None
    publish_ms: Annotated[PositiveInt, bounded(50, 60_000)] = 500
    key_prefix: str = "sidecar:fleet:"
    # What a replica reads of other replicas' pins and sessions in one round, at most.
    max_shared_per_round: Annotated[PositiveInt, bounded(100, 1_000_000)] = 20_000
