"""A group's shadow-traffic bounds (config/rollout.py `ShadowTraffic`): which live
decisions are mirrored, and when the mirror stops itself. Pure, with injected clocks.

In the order they are checked: the share (one decision in every 100/n, not a draw, as
shadow policies sample), the requests in flight, a per-minute token bucket, and the UTC
day's spend — the request's estimated cost is held before it is sent and replaced by its
priced cost once it answered, so the day's cap is never passed by more than what the
requests in flight turn out to cost above their estimates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.config.rollout import ShadowTraffic

DAY_S = 86_400
# Why a sampled decision was not mirrored (`/metrics` labels, fixed).
BUSY, PER_MINUTE, DAILY_SPEND = "max_concurrent", "max_per_minute", "max_daily_usd"


@dataclass(slots=True)
class MirrorBounds:
    settings: ShadowTraffic
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    in_flight: int = 0
    spent_usd: float = 0.0          # today's, held estimates included
    _credit: int = 0
    _tokens: float = field(default=-1.0)
    _refilled_at: float = 0.0
    _day: int = -1

    def sampled(self) -> bool:
        """Whether this decision is in the mirrored share."""
        self._credit += round(self.settings.sample_percent * 1000)  # exact: in 1/1000 %
        if self._credit < 100_000:
            return False
        self._credit -= 100_000
        return True

    def admit(self, estimated_usd: float) -> str | None:
        """None: send it (its estimate held, one more in flight); else the bound that
        stopped it."""
        if self.in_flight >= self.settings.max_concurrent:
            return BUSY
        self._refill()
        if self._tokens < 1.0:
            return PER_MINUTE
        self._roll_day()
        if self.spent_usd + estimated_usd > self.settings.max_daily_usd:
            return DAILY_SPEND
        self._tokens -= 1.0
        self.spent_usd += estimated_usd
        self.in_flight += 1
        return None

    @property
    def day(self) -> int:
        """The UTC day (days since the epoch) today's spend is counted for."""
        return self._day

    def done(self, sent_day: int, estimated_usd: float, cost_usd: float | None) -> None:
        """A mirrored request ended: its priced cost replaces its estimate (kept when it
        reported no usage). `sent_day`: `day` when it was admitted; a request sent
        yesterday is not counted today."""
        self.in_flight -= 1
        if self._roll_day() == sent_day:
            actual = estimated_usd if cost_usd is None else cost_usd
            self.spent_usd = max(0.0, self.spent_usd - estimated_usd + actual)

    def _refill(self) -> None:
        now, size = self.clock(), float(self.settings.max_per_minute)
        if self._tokens < 0:   # the first request: a full bucket
            self._tokens, self._refilled_at = size, now
            return
        self._tokens = min(size, self._tokens + (now - self._refilled_at) * size / 60)
        self._refilled_at = now

    def _roll_day(self) -> int:
        day = int(self.wall_clock() // DAY_S)
        if day != self._day:
            self._day, self.spent_usd = day, 0.0
        return day
