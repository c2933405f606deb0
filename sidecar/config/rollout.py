"""`models.<group>.rollout`: changing a group in front of real callers (docs/rollout.md).

`canary`: a candidate configuration of the group that decides a bounded share of its
requests, guarded; on a guard's breach it is withdrawn for good and the live configuration
decides everything again (rollout/canary_guard.py). Like a shadow policy it names only what
differs from the group — another strategy, routing policy or weights — plus the targets
that serve the canary only (a new target: declared in `targets` so Envoy has its cluster
and key, routed only by the candidate). Promotion is an operator's edit: drop the block
and keep the new target, or copy the candidate's settings into the group.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sidecar.config.fields import (
    Fraction,
    NonNegativeInt,
    PositiveFloat,
    StrictModel,
    bounded,
)
from sidecar.config.policy import RoutingPolicy


class CanaryGuards(StrictModel):
    """What withdraws the canary, judged on its own requests within the group's observation
    window (`routing_policy.dynamic_score.observation_window_seconds`, the window the rest
    of routing reads). Unset guards are not judged; at least one must be set."""

    # The share of the canary's requests that failed (an upstream error, timeout or
    # refusal; a caller's hang-up is not one): breached when the 95 % Wilson interval's
    # lower bound is above it, so a couple of unlucky errors do not withdraw a canary.
    max_error_rate: Fraction | None = None
    max_p95_latency_ms: PositiveFloat | None = None
    # Time to the first byte of the answer: the first event of a stream.
    max_p95_ttft_ms: PositiveFloat | None = None
    # The mean priced cost of the canary's answered requests.
    max_cost_per_request_usd: PositiveFloat | None = None
    # Requests of the canary within the window before any guard is judged.
    min_requests: Annotated[int, bounded(1, 100_000)] = 20

    @model_validator(mode="after")
    def _one_guard(self) -> CanaryGuards:
        if (self.max_error_rate is None and self.max_p95_latency_ms is None
                and self.max_p95_ttft_ms is None and self.max_cost_per_request_usd is None):
            raise ValueError("set at least one guard: max_error_rate, max_p95_latency_ms, "
                             "max_p95_ttft_ms or max_cost_per_request_usd")
        return self


class Canary(StrictModel):
    # The share of the group's requests the candidate decides: per conversation (by its
    # opening's hash, so every turn, on every replica, is decided by the same side) and,
    # for requests with no conversation, one in every 100/n.
    share_percent: Annotated[float, bounded(0.1, 50)]
    # Unset: the group's own. `script` and `external` are left out as for shadow policies.
    strategy: Literal["weighted", "failover", "dynamic_score"] | None = None
    routing_policy: RoutingPolicy | None = None
    # Target label (`provider/model_ref`) → weight under the candidate.
    weights: dict[str, NonNegativeInt] = Field(default_factory=dict)
    # Labels of group targets only the candidate routes to (the live side excludes them).
    targets: list[str] = Field(default_factory=list)
    guards: CanaryGuards




class ShadowTraffic(StrictModel):
    """A sampled mirror of the group's live requests to a candidate target, sent by the
    sidecar through Envoy's loopback shadow listener after the live decision, never waited
    for, never shown to the caller and never charged to them (rollout/shadow_traffic.py)."""

    # Label (`provider/model_ref`) of a target of the group.
    target: str
    # True: only the mirror sends to it — the live side and a canary leave it out (a target
    # named for the trial). False: a live target too (requests it serves are not mirrored).
    shadow_only: bool = False
    # The share of the group's decisions mirrored: one in every 100/n, not a draw.
    sample_percent: Annotated[float, bounded(0.1, 100)] = 5.0
    # Mirrored requests a minute at most (a token bucket of this size, refilled evenly).
    max_per_minute: Annotated[int, bounded(1, 60_000)] = 60
    # What the mirror may spend a UTC day, priced at the candidate's prices: estimated
    # before each request is sent, actual once it answered. Needs the candidate's pricing.
    max_daily_usd: Annotated[float, bounded(0.0001, 1_000_000)] = 5.0
    # Mirrored requests in flight at most; past it a request is not mirrored.
    max_concurrent: Annotated[int, bounded(1, 256)] = 4
    # Whether what the candidate did feeds its observations (warm before it serves).
    feeds_observations: bool = True


class Rollout(StrictModel):
    canary: Canary | None = None
    shadow_traffic: ShadowTraffic | None = None
