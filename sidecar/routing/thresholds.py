"""`thresholds`: health limits applied to warm targets with enough evidence. A target is
judged once it has `thresholds.min_observations` in the window (unset: the policy's
`min_observations`; cold targets are never excluded: there is nothing to judge yet), and
a rate excludes it only when its one-sided lower confidence bound (Wilson score interval,
`thresholds.confidence`, 0.95) is above the limit: one failure in a handful of requests is
not a 3 % error rate (issue #31; Envoy's outlier detection likewise waits for
`success_rate_request_volume`). A figure over its limit on too little evidence is
reported (`unproven`: the trace, `explain`, `/metrics`), not acted on.

`max_p95_latency_ms` is compared with the target's observed p95 latency, as the SPEC
says; with `latency_basis: work_normalized`, with its p95 latency on equal work
(`TargetObservations.work_latency_ms`: each reply's time for a 256-token reply, a unary
reply's generation counted once; the plain p95 where usage is not reported), so that a
target is excluded for being slow, not for receiving the long-output requests.

If the thresholds would remove every remaining target, the least-bad one is kept and the
decision is marked `thresholds_relaxed` (availability first). Badness is the largest ratio
of an observed figure to its limit; ties go to the higher weight, then the earlier target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist

from sidecar.config.policy import Thresholds
from sidecar.routing.observations import TargetObservations

# Probing's futility test judges a rate by its lower confidence bound at this z (one-sided
# 84 %), not the thresholds' own (95 %): one failure in the first 12 probes of a 3 % limit
# ends the round (at 95 %: in the first 7). z = 0, the observed rate, also ended the rounds
# of a target within its limits (2.5 % errors on average) and cost the family's flapping
# members their saving (bench/results/probe_share.md).
PROBE_FUTILITY_Z = 1.0


@cache
def z_of(confidence: float) -> float:
    """The one-sided normal quantile of a confidence level (0.95: 1.645)."""
    return NormalDist().inv_cdf(confidence)


def wilson_bounds(rate: float, count: int, z: float) -> tuple[float, float]:
    """The Wilson score interval of a rate observed over `count` trials: sound for small
    counts and rates near 0, where the normal approximation is not."""
    if count <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (rate + z2 / (2 * count)) / (1 + z2 / count)
    half = z * math.sqrt(max(0.0, rate * (1 - rate) / count + z2 / (4 * count * count)))
    half /= 1 + z2 / count
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A warm target's thresholds: the one it breaks with enough evidence (None: none), and
    those over their limit on too little evidence to act on."""

    violation: str | None
    unproven: tuple[str, ...] = ()


CLEAR = Verdict(None)


def judge(thresholds: Thresholds, obs: TargetObservations, basis: str = "observed_p95",
          min_observations: int = 0) -> Verdict:
    """The thresholds on a target's window: rates by their lower confidence bound, latency
    by its p95, and none of them before `min_observations` (the thresholds' own, if set)."""
    needed = (thresholds.min_observations if thresholds.min_observations is not None
              else min_observations)
    return _judge(thresholds, obs, basis, needed, z_of(thresholds.confidence))


def _judge(thresholds: Thresholds, obs: TargetObservations, basis: str, needed: int,
           z: float) -> Verdict:
    unproven: list[str] = []
    for name, limit, rate in (("thresholds.max_error_rate", thresholds.max_error_rate,
                               obs.error_rate),
                              ("thresholds.max_timeout_rate", thresholds.max_timeout_rate,
                               obs.timeout_rate)):
        if limit is None or rate <= limit:
            continue
        if obs.count >= needed and wilson_bounds(rate, obs.count, z)[0] > limit:
            return Verdict(name, tuple(unproven))
        unproven.append(name)
    latency = obs.latency_ms(basis)
    if (thresholds.max_p95_latency_ms is not None and latency is not None
            and latency > thresholds.max_p95_latency_ms):
        if obs.count >= needed:
            return Verdict("thresholds.max_p95_latency_ms", tuple(unproven))
        unproven.append("thresholds.max_p95_latency_ms")
    return Verdict(None, tuple(unproven)) if unproven else CLEAR


def judge_probes(thresholds: Thresholds, obs: TargetObservations,
                 basis: str = "observed_p95") -> Verdict:
    """The thresholds on a probed target's evidence since probing began, as a futility
    test: no minimum count, and a rate's lower bound at PROBE_FUTILITY_Z rather than the
    thresholds' confidence (issue 41: at 95 % a target failing 10 % of its requests answered
    some thirty probes a round). Re-admission keeps the full standard of evidence
    (`proven_well`); a healthy target unlucky early is probed again after its next
    ejection."""
    return _judge(thresholds, obs, basis, 0, PROBE_FUTILITY_Z)


def proven_well(thresholds: Thresholds, obs: TargetObservations,
                basis: str = "observed_p95") -> bool:
    """Probing's standard in the other direction: every rate's upper confidence bound at or
    under its limit (a limit of 0 allows no failure at all: no bound is ever under 0), and
    the p95 latency within its limit."""
    z = z_of(thresholds.confidence)
    for limit, rate in ((thresholds.max_error_rate, obs.error_rate),
                        (thresholds.max_timeout_rate, obs.timeout_rate)):
        if limit is None:
            continue
        if limit <= 0:
            if rate > 0:
                return False
        elif wilson_bounds(rate, obs.count, z)[1] > limit:
            return False
    latency = obs.latency_ms(basis)
    return (thresholds.max_p95_latency_ms is None or latency is None
            or latency <= thresholds.max_p95_latency_ms)


def clean_answers_needed(thresholds: Thresholds, at_least: int = 1) -> int:
    """How many answers without a failure bring every rate's upper bound under its limit
    (max_error_rate 0.03 at 0.95: 88): what probing needs at best (docs, tests)."""
    count = at_least
    while not proven_well(thresholds, TargetObservations(count=count)) and count < 100_000:
        count += 1
    return count


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
