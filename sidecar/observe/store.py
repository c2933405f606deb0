"""The observation store: per target, a ring of time slices plus a running total.

Writes are O(1) amortised: an observation lands in the current slice of its target and in
the target's running total over the retention window (the longest configured
`observation_window_seconds`); when a slice falls out of that window its counts are
subtracted from the total and the slice is reused. Memory per target is bounded by the ring
(`slice_seconds` wide slices) whatever the traffic.

Reads are what the router does on every decision. For the retention window they come from
the running total (a percentile walks at most a few hundred histogram buckets); shorter
windows merge slices. Either way the result is cached per (target, window) for at most
`refresh_seconds` and until the next slice begins, so the router's view is at most that old.
The cache holds at most `MAX_CACHED` entries.

A target also keeps a lifetime total that never expires, so the router can take a *tally*
(a copy of it) and later ask what was observed *since*, exactly, whatever the slice width:
how an ejected target's probes are judged (routing/ejection.py). Only a probing or just
re-entered target is asked, and the answer is cached like a window.

Everything runs on the sidecar's single event loop. The clock is injected (monotonic
seconds) so that tests need no sleeps.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sidecar.observe.histogram import Histogram
from sidecar.observe.records import Observation, Outcome
from sidecar.routing.observations import TargetObservations

Clock = Callable[[], float]
MAX_CACHED = 1024


@dataclass
class _Counts:
    """Additive figures: a slice, or the running total of the live slices."""

    start: int = -1                    # slice number (time // slice_seconds); -1 = unused
    count: int = 0
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    failed_over: int = 0
    latency: Histogram = field(default_factory=Histogram)
    ttfb: Histogram = field(default_factory=Histogram)
    per_token: Histogram = field(default_factory=Histogram)
    tokens: float = 0.0
    token_seconds: float = 0.0
    input_tokens: float = 0.0          # of `ok` replies that reported their input
    cache_read_tokens: float = 0.0     # and the part of it read from the prompt cache

    def add(self, observation: Observation) -> None:
        self.count += 1
        self.outcomes[observation.outcome] = self.outcomes.get(observation.outcome, 0) + 1
        self.failed_over += int(observation.failed_over)
        if observation.outcome is Outcome.OK:
            if observation.latency_ms is not None:
                self.latency.add(observation.latency_ms)
            if observation.ttfb_ms is not None:
                self.ttfb.add(observation.ttfb_ms)
            per_token = observation.ms_per_output_token
            if per_token is not None:
                self.per_token.add(per_token)
            if observation.output_tokens_per_s is not None:
                self.tokens += observation.output_tokens or 0
                self.token_seconds += (observation.upstream_ms or 0) / 1000
            if observation.input_tokens:
                self.input_tokens += observation.input_tokens
                self.cache_read_tokens += min(observation.cache_read_tokens or 0,
                                              observation.input_tokens)

    def merge(self, other: _Counts, sign: int = 1) -> None:
        self.count += sign * other.count
        for outcome, n in other.outcomes.items():
            remaining = self.outcomes.get(outcome, 0) + sign * n
            if remaining:
                self.outcomes[outcome] = remaining
            else:
                self.outcomes.pop(outcome, None)
        self.failed_over += sign * other.failed_over
        self.latency.merge(other.latency, sign)
        self.ttfb.merge(other.ttfb, sign)
        self.per_token.merge(other.per_token, sign)
        self.tokens += sign * other.tokens
        self.token_seconds += sign * other.token_seconds
        self.input_tokens += sign * other.input_tokens
        self.cache_read_tokens += sign * other.cache_read_tokens

    def copy(self) -> _Counts:
        duplicate = _Counts(self.start)
        duplicate.merge(self)
        return duplicate


@dataclass
class _Target:
    ring: list[_Counts]
    total: _Counts = field(default_factory=_Counts)
    expired_up_to: int = -1            # slices before this are out of `total`
    lifetime: _Counts = field(default_factory=_Counts)


@dataclass(frozen=True, eq=False)
class Tally:
    """What had been observed for one target when it was taken (opaque to the router)."""

    number: int
    counts: _Counts


@dataclass(frozen=True)
class WindowSummary:
    """What the admin view shows for one target and window."""

    window_seconds: int
    figures: TargetObservations
    outcomes: dict[str, int]


class ObservationStore:
    def __init__(self, retention_seconds: int = 600, slice_seconds: int = 10,
                 refresh_seconds: float = 1.0, clock: Clock = time.monotonic,
                 max_retry_after_s: float = 60.0) -> None:
        self._slice_seconds = slice_seconds
        self._retention = retention_seconds
        self._ring_size = max(1, math.ceil(retention_seconds / slice_seconds)) + 2
        self._refresh = refresh_seconds
        self._clock = clock
        self._targets: dict[str, _Target] = {}
        self._cache: OrderedDict[tuple[str, int], tuple[float, int, WindowSummary]] = (
            OrderedDict())
        self._tallies = 0
        self._since_cache: OrderedDict[int, tuple[float, TargetObservations]] = OrderedDict()
        # target → when (this clock) its provider may be called again; one entry a target.
        self._max_retry_after = max_retry_after_s
        self._cooling: dict[str, float] = {}

    @property
    def retention_seconds(self) -> int:
        return self._retention

    def record(self, observation: Observation) -> None:
        now = self._clock()
        current = self._slice(now)
        state = self._targets.get(observation.target)
        if state is None:
            state = self._targets[observation.target] = _Target(
                [_Counts() for _ in range(self._ring_size)])
        self._expire(state, now)
        piece = state.ring[current % self._ring_size]
        if piece.start != current:
            piece.__init__()  # type: ignore[misc]  # reuse: already out of the total
            piece.start = current
        piece.add(observation)
        state.total.add(observation)
        state.lifetime.add(observation)

    def get(self, target_key: str, window_seconds: int) -> TargetObservations:
        """`ObservationView` for the routing core: cheap, at most `refresh_seconds` old."""
        return self.summary(target_key, window_seconds).figures

    def summary(self, target_key: str, window_seconds: int) -> WindowSummary:
        now = self._clock()
        window = max(1, min(window_seconds, self._retention))
        key = (target_key, window)
        current = self._slice(now)
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._refresh and cached[1] == current:
            return cached[2]
        summary = self._summarize(target_key, window, now)
        self._cache[key] = (now, current, summary)
        self._cache.move_to_end(key)
        while len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return summary

    def tally(self, target_key: str) -> Tally:
        """`ObservationView.tally`: a mark to ask `since` about later."""
        self._tallies += 1
        state = self._targets.get(target_key)
        return Tally(self._tallies, state.lifetime.copy() if state else _Counts())

    def since(self, target_key: str, tally: object) -> TargetObservations:
        """`ObservationView.since`: figures over exactly what was observed after `tally`
        was taken, at most `refresh_seconds` old."""
        assert isinstance(tally, Tally)
        now = self._clock()
        cached = self._since_cache.get(tally.number)
        if cached is not None and now - cached[0] < self._refresh:
            return cached[1]
        state = self._targets.get(target_key)
        counts = state.lifetime.copy() if state else _Counts()
        counts.merge(tally.counts, -1)
        figures = _figures(counts)
        self._since_cache[tally.number] = (now, figures)
        self._since_cache.move_to_end(tally.number)
        while len(self._since_cache) > MAX_CACHED:
            self._since_cache.popitem(last=False)
        return figures

    def rate_limited(self, target: str, wait_s: float) -> None:
        """The provider of `target` asked not to be called for `wait_s` seconds (at most
        `max_retry_after_s`); a later, longer request extends the wait, a shorter one
        does not shorten it."""
        wait = min(wait_s, self._max_retry_after)
        if wait <= 0:
            return
        until = self._clock() + wait
        if until > self._cooling.get(target, 0.0):
            self._cooling[target] = until

    def retry_after_s(self, target_key: str) -> float:
        """`ObservationView.retry_after_s`: exact, from the clock (no read cache)."""
        if not self._cooling:
            return 0.0
        until = self._cooling.get(target_key)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._cooling[target_key]
            return 0.0
        return left

    def targets(self) -> list[str]:
        return sorted(self._targets)

    def _slice(self, now: float) -> int:
        return int(now // self._slice_seconds)

    def _expire(self, state: _Target, now: float) -> None:
        """Subtract every slice that has left the retention window from the total."""
        first_live = self._slice(now - self._retention)
        if first_live <= state.expired_up_to:
            return
        for piece in state.ring:
            if 0 <= piece.start < first_live:
                state.total.merge(piece, -1)
                piece.start = -1
        state.expired_up_to = first_live

    def _summarize(self, target: str, window: int, now: float) -> WindowSummary:
        """Everything observed in slices overlapping the last `window` seconds: an
        observation counts for at least the window and leaves at most one slice later."""
        state = self._targets.get(target)
        if state is None:
            return WindowSummary(window, TargetObservations(
                retry_after_s=self.retry_after_s(target)), {})
        self._expire(state, now)
        if window >= self._retention:
            counts = state.total
        else:
            counts = _Counts()
            first, current = self._slice(now - window), self._slice(now)
            for piece in state.ring:
                if first <= piece.start <= current:
                    counts.merge(piece)
        figures = _figures(counts)
        waiting = self.retry_after_s(target)
        if waiting:
            figures = replace(figures, retry_after_s=waiting)
        return WindowSummary(window, figures,
                             {outcome.value: n for outcome, n in counts.outcomes.items()})


def _figures(counts: _Counts) -> TargetObservations:
    total = counts.count

    def rate(n: int) -> float:
        return n / total if total else 0.0

    errors = sum(n for outcome, n in counts.outcomes.items() if outcome.is_error)
    return TargetObservations(
        count=total,
        p95_latency_ms=counts.latency.percentile(0.95),
        p95_ttfb_ms=counts.ttfb.percentile(0.95),
        p95_ms_per_output_token=counts.per_token.percentile(0.95),
        output_tokens_per_s=(counts.tokens / counts.token_seconds
                             if counts.token_seconds > 0 else None),
        error_rate=rate(errors),
        timeout_rate=rate(counts.outcomes.get(Outcome.UPSTREAM_TIMEOUT, 0)),
        fallback_rate=rate(counts.failed_over),
        cancel_rate=rate(counts.outcomes.get(Outcome.CLIENT_CANCEL, 0)),
        cache_read_share=(counts.cache_read_tokens / counts.input_tokens
                          if counts.input_tokens > 0 else None),
    )
