"""Off-policy estimators: what a candidate policy's decisions would have cost, how fast and
how reliable they would have been, from outcomes logged under another policy.

Each logged decision i gives: the primary a_i the logging policy chose, with probability
p_i; its outcome r_i (cost, latency, or 1 for a client-visible error); the candidate's
probability of every target, π(· | x_i); and a request class c_i for the reward model.
With w_i = π(a_i | x_i) / p_i:

- IPS (inverse propensity scoring): mean(w_i r_i). Unbiased when the logging policy gives
  every target the candidate uses a positive probability.
- SNIPS (self-normalized): Σ w_i r_i / Σ w_i. A little biased, much less variable.
- DR (doubly robust): mean(Σ_a π(a | x_i) r̂(a, c_i) + w_i (r_i − r̂(a_i, c_i))), with r̂
  the mean logged outcome per (target, class), cross-fitted: rows of one fold (drawn at
  random, seeded) are modelled on the other, so no row corrects its own prediction.
  Unbiased if either the probabilities or the model are right, and tighter than IPS when
  the model is good.

Intervals are normal approximations at `confidence` from the per-row terms' sample variance
(SNIPS by the delta method), and the candidate-minus-logged difference is a paired DR
interval (the same rows, so most noise cancels). Pure: no I/O; validated against known
truth in tests/unit/evaluation/test_estimators.py.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

_FOLD_SEED = 31


@dataclass(frozen=True, slots=True)
class Sample:
    action: str                   # the logged primary
    logged_probability: float     # p_i > 0
    outcome: float                # r_i
    candidate: Mapping[str, float]  # π(· | x_i): target → probability (sums to 1)
    cell: str = ""                # the request class the reward model groups by


@dataclass(frozen=True, slots=True)
class Interval:
    value: float
    low: float
    high: float

    def covers(self, truth: float) -> bool:
        return self.low <= truth <= self.high


@dataclass(frozen=True, slots=True)
class Estimate:
    n: int
    logged: Interval       # the logging policy's own mean outcome
    ips: Interval
    snips: Interval
    dr: Interval
    delta: Interval        # DR candidate minus logged, paired
    effective_n: float     # (Σw)² / Σw²: how many rows the weights are worth


_UNKNOWN = Interval(math.nan, -math.inf, math.inf)


def _interval(terms: Sequence[float], z: float) -> Interval:
    n = len(terms)
    mean = sum(terms) / n
    if n < 2:
        return Interval(mean, -math.inf, math.inf)
    variance = sum((t - mean) ** 2 for t in terms) / (n - 1)
    half = z * math.sqrt(variance / n)
    return Interval(mean, mean - half, mean + half)


def estimate(samples: Sequence[Sample], confidence: float = 0.95) -> Estimate | None:
    """None without samples."""
    n = len(samples)
    if n == 0:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    weights = [s.candidate.get(s.action, 0.0) / s.logged_probability for s in samples]
    outcomes = [s.outcome for s in samples]
    ips_terms = [w * r for w, r in zip(weights, outcomes, strict=True)]
    total_weight = sum(weights)
    if total_weight > 0:
        snips_value = sum(ips_terms) / total_weight
        mean_weight = total_weight / n
        snips_terms = [snips_value + w * (r - snips_value) / mean_weight
                       for w, r in zip(weights, outcomes, strict=True)]
        snips = _interval(snips_terms, z)
        snips = Interval(snips_value, snips.low, snips.high)
    else:  # the candidate never picks what was logged: nothing to normalise by
        snips = Interval(math.nan, -math.inf, math.inf)
    squares = sum(w * w for w in weights)
    logged = {s.action for s in samples}
    if any(p > 0 and a not in logged for s in samples for a, p in s.candidate.items()):
        # The candidate chooses targets no row shows an outcome of: a model of them would
        # be made up (the overall mean), so there is no doubly robust estimate.
        dr = delta = _UNKNOWN
    else:
        predict = _cross_fitted_model(samples)
        dr_terms = []
        for index, (s, w) in enumerate(zip(samples, weights, strict=True)):
            model = predict(index)
            direct = sum(p * model(a, s.cell) for a, p in s.candidate.items())
            dr_terms.append(direct + w * (s.outcome - model(s.action, s.cell)))
        dr = _interval(dr_terms, z)
        delta = _interval([d - r for d, r in zip(dr_terms, outcomes, strict=True)], z)
    return Estimate(
        n=n, logged=_interval(outcomes, z), ips=_interval(ips_terms, z), snips=snips,
        dr=dr, delta=delta,
        effective_n=(total_weight * total_weight / squares) if squares > 0 else 0.0)


class _Means:
    """Mean outcome per (target, cell), per target, and overall: the reward model, falling
    back to the coarser mean where a finer one has no rows."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        cells: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        actions: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        total = [0.0, 0.0]
        for s in samples:
            for bucket in (cells[s.action, s.cell], actions[s.action], total):
                bucket[0] += s.outcome
                bucket[1] += 1
        self._cells = {k: v[0] / v[1] for k, v in cells.items()}
        self._actions = {k: v[0] / v[1] for k, v in actions.items()}
        self._overall = total[0] / total[1] if total[1] else 0.0

    def __call__(self, action: str, cell: str) -> float:
        found = self._cells.get((action, cell))
        if found is not None:
            return found
        return self._actions.get(action, self._overall)


def _cross_fitted_model(samples: Sequence[Sample]):  # type: ignore[no-untyped-def]
    """Row i's model is fitted on the other fold. Folds are drawn by a seeded generator, not
    by position: the rotation's picks repeat with a short period, so a split by position
    (odd and even rows) can leave a target out of one fold and bias the estimate."""
    draw = random.Random(_FOLD_SEED)
    fold = [draw.random() < 0.5 for _ in samples]
    models = (_Means([s for s, f in zip(samples, fold, strict=True) if f]),
              _Means([s for s, f in zip(samples, fold, strict=True) if not f]))
    return lambda index: models[0] if not fold[index] else models[1]


def target_shares(samples: Sequence[Sample]) -> tuple[dict[str, float], dict[str, float]]:
    """Each target's share of primaries: as logged, and expected under the candidate."""
    logged: dict[str, float] = defaultdict(float)
    candidate: dict[str, float] = defaultdict(float)
    for s in samples:
        logged[s.action] += 1
        for target, probability in s.candidate.items():
            candidate[target] += probability
    n = len(samples) or 1
    return ({t: v / n for t, v in sorted(logged.items())},
            {t: v / n for t, v in sorted(candidate.items())})
