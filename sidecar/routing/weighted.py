"""Smooth weighted round-robin: exact weight proportions, evenly interleaved, deterministic.

With constant weights, over any run of picks the count of each candidate stays within one of
its proportional share, and the sequence depends only on the weights and the pick count, so a
group's traffic mix is reproducible from configuration (and observation state) alone.
Weights may change between picks (dynamic_score blends them per request); the accumulated
position carries over, which keeps the realised mix close to the weights in force.
"""

from __future__ import annotations

from collections.abc import Sequence


class SmoothWeightedRoundRobin:
    """Per-group rotation state over target indices (the Nginx smooth round-robin)."""

    __slots__ = ("_current",)

    def __init__(self, size: int) -> None:
        self._current = [0.0] * size

    def pick(self, candidates: Sequence[int], weights: Sequence[float]) -> int:
        """Pick one of `candidates` (target indices) given their `weights` (same order).
        When every weight is zero the first candidate is picked and the state is unchanged."""
        total = sum(weights)
        if total <= 0:
            return candidates[0]
        best = -1
        for index, weight in zip(candidates, weights, strict=True):
            self._current[index] += weight
            if best < 0 or self._current[index] > self._current[best]:
                best = index
        self._current[best] -= total
        return best
