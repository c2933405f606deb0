"""Shadow traffic's bounds (rollout/mirror_bounds.py): each stops the mirror at its
bound, and counts come back when requests end."""

from __future__ import annotations

import pytest

from sidecar.config.rollout import ShadowTraffic
from sidecar.rollout.mirror_bounds import BUSY, DAILY_SPEND, DAY_S, PER_MINUTE, MirrorBounds


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bounds(**settings) -> tuple[MirrorBounds, Clock, Clock]:
    clock, wall = Clock(), Clock(20_000 * DAY_S + 3600)
    base = {"target": "q/b", "max_concurrent": 256, "max_per_minute": 60_000,
            "max_daily_usd": 1000.0}
    return MirrorBounds(ShadowTraffic(**{**base, **settings}), clock, wall), clock, wall


def test_the_share_is_one_in_every_100_over_n() -> None:
    mirror, _, _ = bounds(sample_percent=10)
    picks = [mirror.sampled() for _ in range(100)]
    assert picks.count(True) == 10 and picks.index(True) == 9


def test_concurrency_stops_the_mirror_until_a_request_ends() -> None:
    mirror, _, _ = bounds(max_concurrent=2)
    assert mirror.admit(0.01) is None and mirror.admit(0.01) is None
    assert mirror.admit(0.01) == BUSY
    mirror.done(mirror.day, 0.01, 0.01)
    assert mirror.admit(0.01) is None


def test_the_per_minute_bucket_refills_evenly() -> None:
    mirror, clock, _ = bounds(max_per_minute=60)
    sent = 0
    while mirror.admit(0.0) is None:
        sent += 1
        mirror.done(mirror.day, 0.0, 0.0)
    assert sent == 60 and mirror.admit(0.0) == PER_MINUTE
    clock.now += 1.0          # one token a second
    assert mirror.admit(0.0) is None
    assert mirror.admit(0.0) == PER_MINUTE


def test_the_daily_cap_counts_estimates_then_actual_costs_and_resets_at_midnight() -> None:
    mirror, _, wall = bounds(max_daily_usd=1.0)
    assert mirror.admit(0.6) is None
    assert mirror.admit(0.6) == DAILY_SPEND       # 0.6 held + 0.6 > 1.0
    sent = mirror.day
    mirror.done(sent, 0.6, 0.1)                    # it cost less than estimated
    assert mirror.spent_usd == pytest.approx(0.1)
    assert mirror.admit(0.6) is None
    wall.now += DAY_S                              # a new UTC day
    assert mirror.admit(0.9) is None and mirror.spent_usd == pytest.approx(0.9)
    mirror.done(sent, 0.6, 5.0)                    # yesterday's request: not today's spend
    assert mirror.spent_usd == pytest.approx(0.9)
    assert mirror.in_flight == 1
