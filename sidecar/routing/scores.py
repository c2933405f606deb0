"""The six scores, each bounded to [0, 1]; 1 is best. A score whose signal is disabled, or
whose inputs are unknown for a target, is the neutral 0.5 so it cannot decide anything.

| score | definition (over the candidates of one decision) |
| --- | --- |
| cost_score | cheapest estimated request cost / this target's cost (1 for the cheapest; |
|            | a paid target scores 0 when another is free) |
| latency_score | lowest p95 latency / this target's (warm targets only); with        |
|               | `latency_basis: work_normalized`, on equal work: the p95 of each reply's |
|               | time for a 256-token reply, or the plain p95 where usage is not reported |
| throughput_score | this target's observed output tokens/s / the highest (warm targets only) |
| reliability_score | 1 − min(1, error + timeout + fallback rates + ½ cancel rate) (warm only) |
| complexity_score | request complexity points / 6, capped at 1 (same for every target) |
| eval_quality_score | configured evaluation quality (see capabilities.eval_quality) |
| budget_pressure | share of the caller's daily spend budget used, 0–1 (same for every |
|                 | target; 0 without a `spend_per_day_usd` quota): multiply it into a term |
|                 | (`budget_pressure * cost_score`) to lean on price as the budget runs down |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.billing import Usage, cost_usd
from sidecar.config.models import Target
from sidecar.config.policy import Signals
from sidecar.routing.observations import TargetObservations

NEUTRAL = 0.5
# Callers hang up for their own reasons too: a cancellation counts half a failure.
CANCEL_WEIGHT = 0.5


def estimated_cost_usd(target: Target, input_tokens: int, output_tokens: int,
                       cache_read_share: float = 0.0) -> float | None:
    """Estimated cost of one request on `target`, or None when its pricing is unknown: the
    same rule as the bill (sidecar/billing.py), with `cache_read_share` of the input
    expected from the provider's prompt cache (the share the target was observed to
    serve from it)."""
    if target.pricing is None:
        return None
    read = round(input_tokens * max(0.0, min(1.0, cache_read_share))) if cache_read_share else 0
    return cost_usd(target.pricing.rates, Usage(input_tokens, output_tokens, read))


@dataclass(frozen=True, slots=True)
class Candidate:
    """What scoring needs to know of one eligible target."""

    target: Target
    observations: TargetObservations
    warm: bool
    cost_usd: float | None
    quality: float | None  # capabilities.eval_quality of the target (configuration only)


def _ratio(numerator: float, denominator: float) -> float:
    if denominator <= 0:
        return 1.0 if numerator <= 0 else 0.0
    return max(0.0, min(1.0, numerator / denominator))


def score_candidates(candidates: Sequence[Candidate], signals: Signals,
                     complexity_score: float | None,
                     latency_basis: str = "observed_p95",
                     budget_pressure: float = 0.0) -> list[dict[str, float]]:
    """Every score of every candidate."""
    costs = [c.cost_usd for c in candidates if c.cost_usd is not None]
    cheapest = min(costs) if costs else None
    warm = [c.observations for c in candidates if c.warm]
    latencies = [latency for o in warm if (latency := o.latency_ms(latency_basis)) is not None]
    fastest = min(latencies) if latencies else None
    speeds = [o.output_tokens_per_s for o in warm if o.output_tokens_per_s is not None]
    top_speed = max(speeds) if speeds else None
    observed = signals.observed_performance.enabled
    cost_enabled = signals.cost.enabled
    quality_enabled = signals.evaluation_metadata.enabled
    complexity = NEUTRAL if complexity_score is None else complexity_score

    results = []
    for candidate in candidates:
        obs = candidate.observations
        quality = candidate.quality if quality_enabled else None
        cost = latency = throughput = reliability = NEUTRAL
        if cost_enabled and candidate.cost_usd is not None and cheapest is not None:
            cost = _ratio(cheapest, candidate.cost_usd)
        if observed and candidate.warm:
            observed_latency = obs.latency_ms(latency_basis)
            if observed_latency is not None and fastest is not None:
                latency = _ratio(fastest, observed_latency)
            if obs.output_tokens_per_s is not None and top_speed:
                throughput = _ratio(obs.output_tokens_per_s, top_speed)
            failures = (obs.error_rate + obs.timeout_rate + obs.fallback_rate
                        + CANCEL_WEIGHT * obs.cancel_rate)
            reliability = 1.0 - min(1.0, max(0.0, failures))
        results.append({
            "cost_score": cost, "latency_score": latency, "throughput_score": throughput,
            "reliability_score": reliability, "complexity_score": complexity,
            "eval_quality_score": NEUTRAL if quality is None else quality,
            "budget_pressure": budget_pressure,
        })
    return results
