"""Smooth weighted round-robin: exact weight proportions, evenly interleaved, deterministic.

Over any run of `sum(weights)` consecutive picks from a fresh state each target is picked
exactly `weight` times, and the sequence depends only on the weights and the pick count, so
a group's traffic mix is reproducible from configuration alone.
"""

from __future__ import annotations

from collections.abc import Sequence


class SmoothWeightedRoundRobin:
    """Per-group state for the smooth weighted round-robin of Nginx fame, over a subset."""

    __slots__ = ("_current", "_weights")

    def __init__(self, weights: Sequence[int]) -> None:
        self._weights = list(weights)
        self._current = [0] * len(weights)

    def pick(self, candidates: Sequence[int]) -> int:
        """Pick one index among `candidates` (indices into the weights). Zero-weight
        candidates are chosen only when every candidate has weight zero."""
        total = sum(self._weights[i] for i in candidates)
        if total == 0:
            return min(candidates)
        best = -1
        for i in candidates:
            self._current[i] += self._weights[i]
            if best < 0 or self._current[i] > self._current[best]:
                best = i
        self._current[best] -= total
        return best
