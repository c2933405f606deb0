"""Deterministic weighted rotation with every target within one request of its share.

This is Tijdeman's solution to the "chairman assignment problem" (1980): with k candidates
and σ = 1 − 1/(2k − 2), a candidate's next turn becomes *available* once its entitlement
exceeds its count by 1 − σ, and among available candidates the one whose turn is due soonest
(entitlement would exceed count by σ first) goes next. For constant shares λ_i this keeps
|count_i − n·λ_i| ≤ 1 − 1/(2k − 2) < 1 after every decision n, which the smooth weighted
round-robin of Nginx does not (its error can exceed one request).

State is one *deficit* per target: entitlement minus picks, in units of decisions. Shares
may change between decisions (dynamic_score blends them per request) and the candidate set
may differ (eligibility): a target that is not a candidate neither earns nor spends. With
integer weights over a full cycle of sum(weights) decisions the mix is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

_DIGITS = 12
_TIE = 1e-9
_CYCLE_END = 1e-6  # rounding noise at a cycle's end is ~1e-11; more would mean a bug


class WeightedRotation:
    """Per-group rotation state over target indices."""

    __slots__ = ("_cycle_key", "_cycle_left", "_deficit")

    def __init__(self, size: int) -> None:
        self._deficit = [0.0] * size
        self._cycle_key: tuple[tuple[int, ...], tuple[float, ...]] | None = None
        self._cycle_left = 0  # decisions until the current whole-number cycle ends

    def pick(self, candidates: Sequence[int], weights: Sequence[float]) -> int:
        """Pick one of `candidates` (target indices) given their `weights` (same order, any
        scale). When every weight is zero the first candidate is picked, state unchanged."""
        total = sum(weights)
        if total <= 0:
            return candidates[0]
        self._start_cycle(candidates, weights, total)
        k = len(candidates)
        sigma = 1.0 - 1.0 / (2 * k - 2) if k > 1 else 0.0
        best = -1
        best_key = 0.0
        fallback = -1
        fallback_key = 0.0
        for index, weight in zip(candidates, weights, strict=True):
            if weight <= 0:
                continue
            share = weight / total
            # Rounded so that float noise never decides a tie (ties go to the earlier
            # target); whole-number cycles are settled exactly (`_start_cycle`).
            deficit = self._deficit[index] = round(self._deficit[index] + share, _DIGITS)
            due = (sigma - deficit) / share  # decisions until this turn is late
            if fallback < 0 or due < fallback_key - _TIE:
                fallback, fallback_key = index, due
            if deficit >= 1.0 - sigma - _TIE and (best < 0 or due < best_key - _TIE):
                best, best_key = index, due
        chosen = best if best >= 0 else fallback
        self._deficit[chosen] = round(self._deficit[chosen] - 1.0, _DIGITS)
        if self._cycle_left > 0:
            self._cycle_left -= 1
            if self._cycle_left == 0 and all(abs(self._deficit[i]) < _CYCLE_END
                                             for i in candidates):
                for i in candidates:
                    self._deficit[i] = 0.0
                self._cycle_left = int(total)
        return chosen

    def _start_cycle(self, candidates: Sequence[int], weights: Sequence[float],
                     total: float) -> None:
        """With whole-number weights and the same candidates, a cycle that starts with every
        candidate's deficit at zero ends, sum(weights) decisions later, with every deficit
        exactly zero again (each got exactly its weight in picks). Floats leave ~1e-11 of
        rounding per cycle instead, which adds up until a near-tie goes the other way and
        the cycle stops repeating; so the end of such a cycle is set to zero (`pick`).
        Anything else (fractional or changing shares, another candidate set, a state that
        is not at zero) is left to the rounding."""
        key = (tuple(candidates), tuple(weights))
        if key == self._cycle_key:
            return
        self._cycle_key = key
        whole = all(float(w).is_integer() for w in weights)
        clean = not any(self._deficit[i] for i in candidates)
        self._cycle_left = int(total) if whole and clean else 0
