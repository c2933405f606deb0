"""The wire form of a slice: exact round trips, and nothing out of shape accepted."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sidecar.observe.records import Observation, Outcome
from sidecar.observe.slice_counts import MAX_WIRE_BYTES, SliceCounts, from_wire, to_wire

observations = st.builds(
    Observation, target=st.just("p/m"), outcome=st.sampled_from(list(Outcome)),
    latency_ms=st.none() | st.floats(0, 1e6), ttfb_ms=st.none() | st.floats(0, 1e6),
    upstream_ms=st.none() | st.floats(0, 1e6), output_tokens=st.none() | st.integers(0, 10**6),
    input_tokens=st.none() | st.integers(0, 10**6),
    cache_read_tokens=st.none() | st.integers(0, 10**6), failed_over=st.booleans())


def figures(counts: SliceCounts) -> tuple:
    return (counts.count, counts.outcomes, counts.failed_over, counts.latency.counts,
            counts.ttfb.counts, counts.per_token.counts, counts.tokens, counts.token_seconds,
            counts.input_tokens, counts.cache_read_tokens)


@given(st.lists(observations, max_size=40))
def test_round_trip_is_exact(seen: list[Observation]) -> None:
    counts = SliceCounts()
    for observation in seen:
        counts.add(observation)
    again = from_wire(to_wire(counts))
    assert again is not None and figures(again) == figures(counts)


def test_anything_out_of_shape_is_refused() -> None:
    good = json.loads(to_wire(_one()))
    for broken in ({**good, "n": -1}, {**good, "n": True}, {**good, "o": {"nonsense": 1}},
                   {**good, "n": 5}, {**good, "l": {"9999": 1}}, {**good, "tk": float("nan")},
                   {**good, "tk": "7"}, {"o": {}}, [1, 2]):
        assert from_wire(json.dumps(broken).encode()) is None, broken
    assert from_wire(b"not json") is None
    assert from_wire(b" " * (MAX_WIRE_BYTES + 1)) is None


def _one() -> SliceCounts:
    counts = SliceCounts()
    counts.add(Observation("p/m", Outcome.OK, latency_ms=10, ttfb_ms=5, upstream_ms=9,
                           output_tokens=3))
    return counts


def test_times_from_other_replicas_are_never_trusted_into_the_future() -> None:
    """A clock-skewed or hostile entry cannot extend a TTL or eject a target for ever."""
    from sidecar.gateway.sessions import Session, SessionStore
    from sidecar.routing.affinity import AffinityStore
    from sidecar.routing.ejection import Ejections, Health
    from tests.clock import ManualClock

    clock = ManualClock(1_000.0)
    pins = AffinityStore(ttl_seconds=60, max_entries=10, clock=clock)
    assert pins.pinned_elsewhere(b"k" * 32, 0, created=1e12)
    clock.now += 60
    assert pins.lookup(b"k" * 32) == (0, True)  # expired 60 s after *now*, not after 1e12
    sessions = SessionStore(ttl_seconds=60, max_entries=10, clock=clock)
    assert sessions.used_elsewhere("s" * 64, Session(0, None, 1e12))
    clock.now += 60
    assert sessions.get("s" * 64) is None
    ejections = Ejections(60, clock)
    ejections.ejected_elsewhere("p/m", 1e12, 1)
    clock.now += ejections.max_seconds
    assert ejections.health("p/m", clock()) is Health.PROBING
