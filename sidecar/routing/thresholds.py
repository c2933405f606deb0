"""`thresholds`: health limits applied to warm targets (at least `min_observations` in the
window). Cold targets are never excluded by thresholds: there is nothing to judge yet.
`max_p95_latency_ms` is compared with the target's observed p95 latency, as the SPEC
says; with `latency_basis: work_normalized`, with its p95 latency on equal work
(`TargetObservations.work_latency_ms`: p95 TTFB + a 256-token reply at the p95 time per
output token; the plain p95 where usage is not reported), so that a target is excluded for
being slow, not for receiving the long-output requests.

If the thresholds would remove every remaining target, the least-bad one is kept and the
decision is marked `thresholds_relaxed` (availability first). Badness is the largest ratio
of an observed figure to its limit; ties go to the higher weight, then the earlier target.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.config.policy import Thresholds
from sidecar.routing.observations import TargetObservations


def threshold_violation(thresholds: Thresholds, obs: TargetObservations,
                        basis: str = "observed_p95") -> str | None:
    if thresholds.max_error_rate is not None and obs.error_rate > thresholds.max_error_rate:
        return "thresholds.max_error_rate"
    if thresholds.max_timeout_rate is not None and obs.timeout_rate > thresholds.max_timeout_rate:
        return "thresholds.max_timeout_rate"
    latency = obs.latency_ms(basis)
    if (thresholds.max_p95_latency_ms is not None and latency is not None
            and latency > thresholds.max_p95_latency_ms):
        return "thresholds.max_p95_latency_ms"
    return None


def badness(thresholds: Thresholds, obs: TargetObservations,
            basis: str = "observed_p95") -> float:
    ratios = [0.0]
    for limit, value in ((thresholds.max_error_rate, obs.error_rate),
                         (thresholds.max_timeout_rate, obs.timeout_rate),
                         (thresholds.max_p95_latency_ms, obs.latency_ms(basis))):
        if limit is None or value is None:
            continue
        ratios.append(value / limit if limit > 0 else (float("inf") if value > 0 else 0.0))
    return max(ratios)


def least_bad(thresholds: Thresholds, candidates: Sequence[tuple[int, int, TargetObservations]],
              basis: str = "observed_p95") -> int:
    """Index of the least-bad candidate among (index, weight, observations)."""
    return min(candidates, key=lambda c: (badness(thresholds, c[2], basis), -c[1], c[0]))[0]
