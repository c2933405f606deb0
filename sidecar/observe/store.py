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
from typing import TYPE_CHECKING

from sidecar.observe.records import Observation, Outcome
from sidecar.observe.slice_counts import Contribution, SliceCounts
from sidecar.routing.observations import TargetObservations

if TYPE_CHECKING:
    from sidecar.config.models import SidecarConfig

Clock = Callable[[], float]
MAX_CACHED = 1024
# With fleet sharing: the current slice and the two before it are published each round
# (another replica's slices may be up to one slice ahead or behind ours).
OWN_SLICES = 3


@dataclass
class _Target:
    ring: list[SliceCounts]
    total: SliceCounts = field(default_factory=SliceCounts)
    expired_up_to: int = -1            # slices before this are out of `total`
    lifetime: SliceCounts = field(default_factory=SliceCounts)
    # With fleet sharing only: this replica's own counts of its last slices (what it
    # publishes), and what other replicas' published slices added: (replica, their slice
    # number) → (our slice number, counts), so that a newer copy replaces, never adds.
    own: dict[int, SliceCounts] = field(default_factory=dict)
    remote: dict[tuple[str, int], tuple[int, SliceCounts]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Tally:
    """What had been observed for one target when it was taken (opaque to the router)."""

    number: int
    counts: SliceCounts


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
        self._sharing = False  # fleet/observations.py turns it on

    @classmethod
    def for_config(cls, config: SidecarConfig, clock: Clock = time.monotonic
                   ) -> ObservationStore:
        """The store a configuration's `observations` settings describe (the running
        sidecar's, and a replay's or a simulation's on their own clock)."""
        settings = config.observations
        return cls(retention_seconds=config.observation_retention_seconds,
                   slice_seconds=settings.slice_seconds,
                   refresh_seconds=settings.refresh_ms / 1000, clock=clock,
                   max_retry_after_s=settings.max_retry_after_seconds)

    @property
    def slice_seconds(self) -> int:
        return self._slice_seconds

    @property
    def clock(self) -> Clock:
        return self._clock

    def holds(self) -> dict[str, float]:
        """Targets whose providers asked to wait: until when, on this store's clock."""
        now = self._clock()
        return {target: until for target, until in self._cooling.items() if until > now}

    @property
    def retention_seconds(self) -> int:
        return self._retention

    def record(self, observation: Observation) -> None:
        now = self._clock()
        current = self._slice(now)
        state = self._targets.get(observation.target)
        if state is None:
            state = self._targets[observation.target] = _Target(
                [SliceCounts() for _ in range(self._ring_size)])
        self._expire(state, now)
        piece = state.ring[current % self._ring_size]
        if piece.start != current:
            piece.__init__()  # type: ignore[misc]  # reuse: already out of the total
            piece.start = current
        contribution = Contribution(observation)
        piece.add_contribution(contribution)
        state.total.add_contribution(contribution)
        state.lifetime.add_contribution(contribution)
        if self._sharing:
            own = state.own.get(current)
            if own is None:
                own = state.own[current] = SliceCounts(current)
                for number in [n for n in state.own if n < current - OWN_SLICES + 1]:
                    del state.own[number]
            own.add_contribution(contribution)

    def share(self) -> None:
        """From now on keep this replica's own counts apart (fleet/observations.py)."""
        self._sharing = True

    def own_slices(self) -> list[tuple[str, int, SliceCounts]]:
        """This replica's own counts of its last OWN_SLICES slices, per target: what it
        publishes each round (a finished slice a few times more, then no longer)."""
        current = self._slice(self._clock())
        shared = []
        for target, state in self._targets.items():
            for number in list(state.own):
                if number < current - OWN_SLICES + 1:
                    del state.own[number]
                else:
                    shared.append((target, number, state.own[number]))
        return shared

    def merge_remote(self, target: str, source: tuple[str, int], local_slice: int,
                     counts: SliceCounts) -> bool:
        """Another replica's published slice `source` (its name, its slice number), placed
        in our slice `local_slice`: added to the ring, the total and the lifetime, replacing
        the copy of it merged before. False when that slice is no longer live here."""
        now = self._clock()
        state = self._targets.get(target)
        if state is None:
            state = self._targets[target] = _Target(
                [SliceCounts() for _ in range(self._ring_size)])
        self._expire(state, now)
        first_live = self._slice(now - self._retention)
        # Replicas' slice boundaries differ by up to one slice: one a little ahead of ours
        # is placed in our current slice (and moves on with it when it is published again).
        local_slice = min(local_slice, self._slice(now))
        if local_slice < first_live:
            return False
        before = state.remote.get(source)
        if before is not None:
            placed, old = before
            piece = state.ring[placed % self._ring_size]
            if piece.start == placed:
                piece.merge(old, -1)
                state.total.merge(old, -1)
            state.lifetime.merge(old, -1)
        piece = state.ring[local_slice % self._ring_size]
        if piece.start != local_slice:
            piece.__init__()  # type: ignore[misc]  # not live: already out of the total
            piece.start = local_slice
        piece.merge(counts)
        state.total.merge(counts)
        state.lifetime.merge(counts)
        state.remote[source] = (local_slice, counts)
        return True

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
        return Tally(self._tallies, state.lifetime.copy() if state else SliceCounts())

    def since(self, target_key: str, tally: object) -> TargetObservations:
        """`ObservationView.since`: figures over exactly what was observed after `tally`
        was taken, at most `refresh_seconds` old."""
        assert isinstance(tally, Tally)
        now = self._clock()
        cached = self._since_cache.get(tally.number)
        if cached is not None and now - cached[0] < self._refresh:
            return cached[1]
        state = self._targets.get(target_key)
        counts = state.lifetime.copy() if state else SliceCounts()
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
        for source in [k for k, (placed, _) in state.remote.items() if placed < first_live]:
            del state.remote[source]
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
            counts = SliceCounts()
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


def _figures(counts: SliceCounts) -> TargetObservations:
    total = counts.count

    def rate(n: int) -> float:
        return n / total if total else 0.0

    errors = sum(n for outcome, n in counts.outcomes.items() if outcome.is_error)
    return TargetObservations(
        count=total,
        p95_latency_ms=counts.latency.percentile(0.95),
        p95_ttfb_ms=counts.ttfb.percentile(0.95),
        p50_ttfb_ms=counts.ttfb.percentile(0.5),
        p95_ms_per_output_token=counts.per_token.percentile(0.95),
        p95_work_ms=counts.work.percentile(0.95),
        output_tokens_per_s=(counts.tokens / counts.token_seconds
                             if counts.token_seconds > 0 else None),
        error_rate=rate(errors),
        timeout_rate=rate(counts.outcomes.get(Outcome.UPSTREAM_TIMEOUT, 0)),
        fallback_rate=rate(counts.failed_over),
        cancel_rate=rate(counts.outcomes.get(Outcome.CLIENT_CANCEL, 0)),
        cache_read_share=(counts.cache_read_tokens / counts.input_tokens
                          if counts.input_tokens > 0 else None),
    )
