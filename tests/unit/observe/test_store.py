"""The observation store with an injected clock: windows, percentiles, rates, memory."""

from __future__ import annotations

import random
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.observe.histogram import RELATIVE_ERROR, Histogram
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ok(target: str = "p/m", latency: float = 100.0, **fields) -> Observation:
    return Observation(target, Outcome.OK, latency_ms=latency, **fields)


def test_window_expiry_keeps_an_observation_at_least_the_window_and_at_most_one_slice_more():
    clock = Clock(1_000.0)
    store = ObservationStore(retention_seconds=600, slice_seconds=10, refresh_seconds=0,
                             clock=clock)
    store.record(ok())
    for elapsed in (0, 300, 599.9, 600):
        clock.now = 1_000.0 + elapsed
        assert store.get("p/m", 600).count == 1, elapsed
    clock.now = 1_000.0 + 610.01
    assert store.get("p/m", 600).count == 0
    # A shorter window of the same store forgets sooner.
    store.record(ok())
    clock.now += 70.01
    assert store.get("p/m", 60).count == 0 and store.get("p/m", 600).count == 1


def test_reads_are_cached_for_refresh_seconds_and_refreshed_on_a_new_slice() -> None:
    clock = Clock(1_000.0)
    store = ObservationStore(slice_seconds=10, refresh_seconds=1.0, clock=clock)
    assert store.get("p/m", 600).count == 0
    store.record(ok())
    assert store.get("p/m", 600).count == 0      # cached view, at most 1 s old
    clock.now += 1.0
    assert store.get("p/m", 600).count == 1


@given(st.lists(st.floats(min_value=0.2, max_value=600_000), min_size=1, max_size=500))
def test_p95_is_within_the_documented_error_of_brute_force(values: list[float]) -> None:
    histogram = Histogram()
    for value in values:
        histogram.add(value)
    exact = sorted(values)[max(1, -(-len(values) * 95 // 100)) - 1]
    assert histogram.percentile(0.95) == pytest.approx(exact, rel=RELATIVE_ERROR + 1e-9)


def test_rates_and_classes() -> None:
    clock = Clock()
    store = ObservationStore(refresh_seconds=0, clock=clock)
    outcomes = ([Outcome.OK] * 14 + [Outcome.RATE_LIMITED] * 2 + [Outcome.SERVER_ERROR]
                + [Outcome.UPSTREAM_TIMEOUT] * 2 + [Outcome.CLIENT_CANCEL])
    for outcome in outcomes:
        store.record(Observation("p/m", outcome, latency_ms=50, failed_over=outcome is
                                 Outcome.SERVER_ERROR))
    figures = store.get("p/m", 600)
    assert figures.count == 20
    assert figures.error_rate == pytest.approx(3 / 20)
    assert figures.timeout_rate == pytest.approx(2 / 20)
    assert figures.fallback_rate == pytest.approx(1 / 20)
    assert figures.cancel_rate == pytest.approx(1 / 20)
    assert store.summary("p/m", 600).outcomes == {"ok": 14, "rate_limited": 2,
                                                  "server_error": 1, "upstream_timeout": 2,
                                                  "client_cancel": 1}


def test_latency_and_throughput_come_from_successful_requests_only() -> None:
    store = ObservationStore(refresh_seconds=0, clock=Clock())
    store.record(ok(latency=100, ttfb_ms=30, upstream_ms=500, output_tokens=50))
    store.record(ok(latency=100, ttfb_ms=30, upstream_ms=250, output_tokens=50))
    store.record(ok(latency=100, ttfb_ms=30, upstream_ms=0.5, output_tokens=-5))  # ignored
    store.record(Observation("p/m", Outcome.CLIENT_CANCEL, latency_ms=5))
    store.record(Observation("p/m", Outcome.UPSTREAM_TIMEOUT, latency_ms=99_000))
    figures = store.get("p/m", 600)
    # Time-weighted mean: 100 tokens over 0.75 s of generation.
    assert figures.output_tokens_per_s == pytest.approx(100 / 0.75)
    assert figures.p95_latency_ms == pytest.approx(100, rel=RELATIVE_ERROR)
    assert figures.p95_ttfb_ms == pytest.approx(30, rel=RELATIVE_ERROR)


def test_memory_is_bounded_after_a_million_observations() -> None:
    clock = Clock()
    store = ObservationStore(retention_seconds=600, slice_seconds=10, refresh_seconds=0,
                             clock=clock)
    rng = random.Random(7)

    def footprint() -> int:
        total = sys.getsizeof(store._cache)
        for state in store._targets.values():
            for piece in [*state.ring, state.total]:
                total += sys.getsizeof(piece.latency.counts) + sys.getsizeof(piece.ttfb.counts)
                total += sys.getsizeof(piece.outcomes)
        return total

    outcomes = [o for o in Outcome if o is not Outcome.HEDGED_OUT]  # a time figure only
    sizes = []
    for i in range(1_000_000):
        clock.now += 0.002  # 500 observations a second for 2,000 s
        store.record(Observation(f"p/m{i % 3}", outcomes[i % len(outcomes)],
                                 latency_ms=rng.lognormvariate(5, 1.5),
                                 ttfb_ms=rng.lognormvariate(3, 1)))
        if i in (400_000, 999_999):
            sizes.append(footprint())
    assert sizes[1] <= sizes[0] * 1.1           # flat once the ring is full
    assert len(store._targets) == 3
    assert all(len(state.ring) == 62 for state in store._targets.values())
    assert store.get("p/m0", 600).count == pytest.approx(600 * 500 / 3, rel=0.05)


def test_the_running_total_equals_a_fresh_merge_of_the_live_slices() -> None:
    clock = Clock()
    store = ObservationStore(retention_seconds=60, slice_seconds=10, refresh_seconds=0,
                             clock=clock)
    rng = random.Random(3)
    outcomes = list(Outcome)
    for _ in range(5_000):
        clock.now += rng.uniform(0, 0.2)
        store.record(Observation("p/m", rng.choice(outcomes),
                                 latency_ms=rng.uniform(1, 5_000)))
        if rng.random() < 0.01:
            full = store.summary("p/m", 60)            # from the running total
            merged = store.summary("p/m", 59)          # merged from slices
            assert full.outcomes == merged.outcomes or clock.now % 10 > 9  # edge slice
    clock.now += 1_000
    assert store.get("p/m", 60).count == 0
    state = store._targets["p/m"]
    assert state.total.count == 0 and state.total.latency.counts == {}


def test_the_read_cache_is_bounded_whatever_windows_are_asked() -> None:
    store = ObservationStore(refresh_seconds=10, clock=Clock())
    store.record(ok())
    for window in range(1, 20_000):
        store.summary("p/m", window)
    assert len(store._cache) <= 1024
    assert store.summary("p/m", 10**9).window_seconds == 600     # clamped, and says so


def test_since_a_tally_is_exact_whatever_the_slice_width_and_cached_for_refresh() -> None:
    clock = Clock(1_005.0)
    store = ObservationStore(slice_seconds=10, refresh_seconds=1.0, clock=clock)
    store.record(Observation("p/m", Outcome.SERVER_ERROR))  # before: in the same slice
    tally = store.tally("p/m")
    assert store.since("p/m", tally).count == 0
    store.record(ok(latency=200.0))
    store.record(ok(latency=300.0))
    assert store.since("p/m", tally).count == 0  # cached view, at most 1 s old
    clock.now += 1.0
    after = store.since("p/m", tally)
    assert (after.count, after.error_rate) == (2, 0.0)  # the earlier 5xx is not in it
    assert store.get("p/m", 10).count == 3              # the window's slice holds all three
    assert store.since("p/none", store.tally("p/none")).count == 0
    # Lifetime figures survive the retention window, so a tally never goes negative.
    clock.now += 10_000
    store.record(ok())
    clock.now += 1.0
    assert store.since("p/m", tally).count == 3


def test_the_cache_read_share_is_the_cached_part_of_reported_input() -> None:
    """What `cost_score` expects a request's cache reads to be (docs/configuration.md,
    "Pricing"): only `ok` replies that reported their input count."""
    clock = Clock()
    store = ObservationStore(clock=clock)
    assert store.get("p/m", 600).cache_read_share is None
    clock.now += 2  # past the read cache
    store.record(ok(input_tokens=1000, cache_read_tokens=900))
    store.record(ok(input_tokens=1000, cache_read_tokens=100))
    store.record(ok())  # no usage reported
    store.record(Observation("p/m", Outcome.SERVER_ERROR, input_tokens=5000,
                             cache_read_tokens=0))
    assert store.get("p/m", 600).cache_read_share == pytest.approx(0.5)
