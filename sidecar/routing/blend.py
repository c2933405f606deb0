"""Cold start and the capped blend: how far live scores may move traffic from the weights.

With a = max_score_adjustment_percent / 100, w_i the target's configured weight share
(renormalised over the eligible targets), W the summed weight share of the warm targets,
s_i ≥ 0 the warm target's score-term value and k = blend_sharpness:

    cold target:  share_i = w_i
    warm target:  share_i = (1 − a)·w_i + a·W·q_i / Σ_warm q_j,   q_i = e^(k·s_i)

Shares sum to 1. A warm target keeps at least (1 − a)·w_i and gets at most (1 − a)·w_i + a·W:
scores redistribute at most a of the warm targets' combined traffic (the cap). Within that
room the split is decisive: a target whose value is higher by d earns e^(k·d) times the
share of the other, so a clearly better target takes most of the room (k = 8: 0.3 better →
11×), while near-equal targets split it nearly evenly. (Splitting in proportion to the raw
values, as before, gave a target scoring 0.88 only 1.5× the share of one scoring 0.57, so far
less than `a` of the traffic ever moved.) A cold target keeps exactly w_i, so it is never
starved. If Σ_warm s_j is 0 (no information), no score term applies, or a = 0, every target
keeps w_i. Negative or non-finite term values count as 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def weight_shares(weights: Sequence[int]) -> list[float]:
    """Configured weights renormalised over the eligible targets; equal when all are 0."""
    total = sum(weights)
    if total == 0:
        return [1.0 / len(weights)] * len(weights)
    return [w / total for w in weights]


def usable_value(value: float | None) -> float:
    """Term values below 0, or not finite, count as 0."""
    if value is None or not math.isfinite(value):
        return 0.0
    return max(0.0, value)


def blended_shares(shares: Sequence[float], warm: Sequence[bool],
                   values: Sequence[float | None], adjustment: float,
                   sharpness: float = 8.0) -> tuple[list[float], bool]:
    """Final shares, and whether scores moved anything (False: the weights were kept).
    `values[i]` is the warm target's score-term value (None when no term applies)."""
    warm_share = sum(s for s, hot in zip(shares, warm, strict=True) if hot)
    term_values = [usable_value(v) if hot else 0.0 for v, hot in zip(values, warm, strict=True)]
    if sum(term_values) <= 0 or warm_share <= 0 or adjustment <= 0:
        return list(shares), False
    best = max(v for v, hot in zip(term_values, warm, strict=True) if hot)
    # Relative to the best value, so the exponent is ≤ 0 and never overflows.
    pulls = [math.exp(sharpness * (v - best)) if hot else 0.0
             for v, hot in zip(term_values, warm, strict=True)]
    total_pull = sum(pulls)
    return [
        (1 - adjustment) * s + adjustment * warm_share * q / total_pull if hot else s
        for s, hot, q in zip(shares, warm, pulls, strict=True)
    ], True
