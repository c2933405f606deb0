"""The observation store: per target, a ring of time slices covering the longest window.

Writes are O(1): an observation lands in the current slice of its target (slices are
`slice_seconds` wide; a ring holds `retention_seconds` of them, so memory per target is
bounded whatever the traffic). Reads are what the router does on every decision, so they
are served from a per-(target, window) summary that is rebuilt at most every
`refresh_seconds` (and whenever the clock enters a new slice): the router never merges
histograms on the hot path, and its view is never more than `refresh_seconds` old.

Everything runs on the sidecar's single event loop, so a decision reads one consistent view.
The clock is injected (monotonic seconds) so that tests need no sleeps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.observe.histogram import Histogram
from sidecar.observe.records import Observation, Outcome
from sidecar.routing.observations import TargetObservations

Clock = Callable[[], float]


@dataclass
class _Slice:
    """Counters for one time slice of one target."""

    start: int = -1                    # slice number (time // slice_seconds)
    count: int = 0
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    fell_back: int = 0
    latency: Histogram = field(default_factory=Histogram)
    ttfb: Histogram = field(default_factory=Histogram)
    throughput_sum: float = 0.0
    throughput_count: int = 0

    def reset(self, start: int) -> None:
        self.start = start
        self.count = 0
        self.outcomes = {}
        self.fell_back = 0
        self.latency = Histogram()
        self.ttfb = Histogram()
        self.throughput_sum = 0.0
        self.throughput_count = 0


@dataclass(frozen=True)
class WindowSummary:
    """What the admin view shows for one target and window."""

    figures: TargetObservations
    outcomes: dict[str, int]
    p95_ttfb_ms: float | None


class ObservationStore:
    def __init__(self, retention_seconds: int = 600, slice_seconds: int = 10,
                 refresh_seconds: float = 1.0, clock: Clock = time.monotonic) -> None:
        self._slice_seconds = slice_seconds
        self._slices_per_ring = max(1, math.ceil(retention_seconds / slice_seconds)) + 2
        self._refresh = refresh_seconds
        self._clock = clock
        self._rings: dict[str, list[_Slice]] = {}
        self._cache: dict[tuple[str, int], tuple[float, int, WindowSummary]] = {}

    @property
    def retention_seconds(self) -> int:
        return (self._slices_per_ring - 2) * self._slice_seconds

    def record(self, observation: Observation) -> None:
        now = self._slice_number(self._clock())
        ring = self._rings.get(observation.target)
        if ring is None:
            ring = self._rings[observation.target] = [_Slice()
                                                      for _ in range(self._slices_per_ring)]
        current = ring[now % self._slices_per_ring]
        if current.start != now:
            current.reset(now)
        current.count += 1
        current.outcomes[observation.outcome] = current.outcomes.get(observation.outcome, 0) + 1
        current.fell_back += int(observation.fell_back)
        if observation.outcome is Outcome.OK:
            if observation.latency_ms is not None:
                current.latency.add(observation.latency_ms)
            if observation.ttfb_ms is not None:
                current.ttfb.add(observation.ttfb_ms)
            rate = observation.output_tokens_per_s
            if rate is not None:
                current.throughput_sum += rate
                current.throughput_count += 1

    def get(self, target_key: str, window_seconds: int) -> TargetObservations:
        """`ObservationView` for the routing core: cheap, possibly `refresh_seconds` old."""
        return self.summary(target_key, window_seconds).figures

    def summary(self, target_key: str, window_seconds: int) -> WindowSummary:
        now = self._clock()
        key = (target_key, window_seconds)
        cached = self._cache.get(key)
        current_slice = self._slice_number(now)
        if cached is not None and now - cached[0] < self._refresh and cached[1] == current_slice:
            return cached[2]
        summary = self._summarize(target_key, window_seconds, now)
        self._cache[key] = (now, current_slice, summary)
        return summary

    def targets(self) -> list[str]:
        return sorted(self._rings)

    def _slice_number(self, now: float) -> int:
        return int(now // self._slice_seconds)

    def _summarize(self, target: str, window_seconds: int, now: float) -> WindowSummary:
        """Merge every slice that overlaps the last `window_seconds`: an observation counts
        for at least `window_seconds` and leaves at most one slice width later."""
        ring = self._rings.get(target)
        current = self._slice_number(now)
        window = min(window_seconds, self.retention_seconds)
        first = self._slice_number(now - window)
        count = fell_back = throughput_count = 0
        throughput_sum = 0.0
        outcomes: dict[str, int] = {}
        latency, ttfb = Histogram(), Histogram()
        for piece in ring or ():
            if piece.start < first or piece.start > current:
                continue
            count += piece.count
            fell_back += piece.fell_back
            for outcome, n in piece.outcomes.items():
                outcomes[outcome.value] = outcomes.get(outcome.value, 0) + n
            latency.merge(piece.latency)
            ttfb.merge(piece.ttfb)
            throughput_sum += piece.throughput_sum
            throughput_count += piece.throughput_count
        errors = sum(n for name, n in outcomes.items() if Outcome(name).is_error)
        timeouts = outcomes.get(Outcome.UPSTREAM_TIMEOUT.value, 0)
        figures = TargetObservations(
            count=count,
            p95_latency_ms=latency.percentile(0.95),
            p95_ttfb_ms=ttfb.percentile(0.95),
            output_tokens_per_s=(throughput_sum / throughput_count
                                 if throughput_count else None),
            error_rate=errors / count if count else 0.0,
            timeout_rate=timeouts / count if count else 0.0,
            fallback_rate=fell_back / count if count else 0.0,
        )
        return WindowSummary(figures, outcomes, figures.p95_ttfb_ms)
