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
