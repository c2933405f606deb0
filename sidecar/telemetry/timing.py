"""A histogram of ext_proc handling time, cheap enough for every message.

`prometheus_client.Histogram.observe` takes a lock and walks its buckets in Python; this
is one `bisect` and two additions on the event loop thread (the only writer), exposed at
scrape time as `sidecar_ext_proc_handling_seconds` (metrics.py).
"""

from __future__ import annotations

import bisect

# Upper bounds, seconds: a routed decision is tens of microseconds; beyond 0.1 s something
# is wrong (a blocked loop), and the last bucket says so.
BOUNDS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
          100e-3, 1.0)


class HandlingTimes:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: (upper bound, observations at or below it)."""
        running, buckets = 0, []
        for bound, count in zip((*map(repr, BOUNDS), "+Inf"), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets
