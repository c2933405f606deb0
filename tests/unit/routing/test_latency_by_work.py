"""Latency by target, not by mix (issue 14, item 4): with `latency_basis: work_normalized`
the latency score and the `max_p95_latency_ms` threshold compare targets on equal work (the
p95 of each reply's time for a 256-token reply), so the target that receives long outputs
is not penalised for them; without usage the plain p95 is used. A unary reply's generation
is inside its time to first byte and is counted once (issue #31.1: p95 TTFB + 256 × p95 ms
per token excluded a healthy mid-price target). By default (issue #29.11) both follow the
SPEC's words: the observed p95."""

from __future__ import annotations

import pytest

from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.routing.observations import REFERENCE_OUTPUT_TOKENS, TargetObservations
from tests.unit.routing.helpers import config, decide, excluded, request, snapshot, warm

YAML = """
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: longout, weight: 1}
      - {provider: p, model_ref: shortout, weight: 1}
      - {provider: p, model_ref: slow, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 10
        score_terms: [{name: fast, expression: "latency_score"}]
        thresholds: {max_p95_latency_ms: %s}
        latency_basis: %s
"""
GROUP = config(YAML % ("10000", "work_normalized"))
NO_LIMIT = config(YAML % ("null", "work_normalized"))
SPEC_WORDS = config(YAML % ("10000", "observed_p95"))
DEFAULT = config((YAML % ("10000", "observed_p95")).replace(
    "        latency_basis: observed_p95\n", ""))
# Same speed per token; one gets 2,000-token replies, the other 100-token replies.
LONG = warm(p95_latency_ms=20_200, p95_work_ms=200 + 256 * 10)
SHORT = warm(p95_latency_ms=1_200, p95_work_ms=200 + 256 * 10)
SLOW = warm(p95_latency_ms=5_000, p95_work_ms=1_000 + 256 * 40)


def test_work_latency_is_the_p95_of_each_replys_work() -> None:
    assert LONG.work_latency_ms == 200 + REFERENCE_OUTPUT_TOKENS * 10
    assert TargetObservations(count=5, p95_latency_ms=900).work_latency_ms == 900
    assert TargetObservations(count=5).work_latency_ms is None


def test_a_streams_work_is_its_first_event_plus_a_reference_reply_at_its_pace() -> None:
    reply = Observation("p/a", Outcome.OK, ttfb_ms=200, upstream_ms=200 + 10 * 1_000,
                        output_tokens=1_000, streamed=True)
    assert reply.work_ms == pytest.approx(200 + 256 * 10)


def test_a_unary_replys_generation_is_counted_once() -> None:
    """The worked example of docs/dynamic-score.md: a unary reply's first byte comes once
    it is generated."""
    long = Observation("p/a", Outcome.OK, ttfb_ms=20_150, upstream_ms=20_200,
                       output_tokens=2_000)
    assert long.work_ms == pytest.approx(20_200 * 256 / 2_000)  # scaled down to 256 tokens
    short = Observation("p/a", Outcome.OK, ttfb_ms=1_150, upstream_ms=1_200,
                        output_tokens=100)
    assert short.work_ms == 1_200  # as observed: never scaled up


def test_long_outputs_neither_lower_the_score_nor_trip_the_threshold() -> None:
    trace = decide(NO_LIMIT, request(), snapshot(p__longout=LONG, p__shortout=SHORT,
                                                 p__slow=SLOW)).trace
    rows = {c.target: c for c in trace.candidates}
    assert rows["p/longout"].scores["latency_score"] == 1.0
    assert rows["p/shortout"].scores["latency_score"] == 1.0
    assert rows["p/slow"].scores["latency_score"] == pytest.approx(
        (200 + 256 * 10) / (1_000 + 256 * 40), abs=1e-6)
    # 20.2 s p95 over its mix, but 2.76 s on equal work: not excluded; `slow` is, at 11.2 s.
    assert excluded(decide(GROUP, request(), snapshot(
        p__longout=LONG, p__shortout=SHORT, p__slow=SLOW))) == {
        "p/slow": "thresholds.max_p95_latency_ms"}


def test_by_default_the_threshold_and_score_read_the_observed_p95_as_the_spec_says() -> None:
    """Issue #29.11: a target whose observed p95 was 20 s passed a 10 s threshold."""
    observations = snapshot(p__longout=LONG, p__shortout=SHORT, p__slow=SLOW)
    assert DEFAULT.models["g"].routing_policy.dynamic_score.latency_basis == "observed_p95"
    for group in (DEFAULT, SPEC_WORDS):
        assert excluded(decide(group, request(), observations)) == {
            "p/longout": "thresholds.max_p95_latency_ms"}  # 20.2 s observed
    unlimited = config(YAML % ("null", "observed_p95"))
    rows = {c.target: c for c in decide(unlimited, request(), observations).trace.candidates}
    assert rows["p/shortout"].scores["latency_score"] == 1.0
    assert rows["p/slow"].scores["latency_score"] == pytest.approx(1_200 / 5_000, abs=1e-6)
    assert rows["p/longout"].scores["latency_score"] == pytest.approx(1_200 / 20_200, abs=1e-6)


def test_the_store_keeps_the_p95_of_each_replys_work() -> None:
    store = ObservationStore(retention_seconds=60, slice_seconds=10, refresh_seconds=0,
                             clock=lambda: 0.0)
    for tokens in (100, 1_000, 2_000):  # streamed, 10 ms per token whatever the length
        store.record(Observation("p/a", Outcome.OK, latency_ms=200 + 10 * tokens,
                                 ttfb_ms=200, upstream_ms=200 + 10 * tokens,
                                 output_tokens=tokens, streamed=True))
    figures = store.get("p/a", 60)
    assert figures.p95_ms_per_output_token == pytest.approx(10, rel=0.03)
    assert figures.work_latency_ms == pytest.approx(200 + 256 * 10, rel=0.03)


def test_a_healthy_mid_target_with_slow_unary_replies_is_not_excluded() -> None:
    """Issue #31.1, from its figures: unary replies whose first byte came at 5.4 s and last
    at 9.9 s, 214 tokens (21 ms a token after the first byte). The old basis, p95 TTFB +
    256 × p95 ms per token = 10.8 s, excluded it from a 10 s threshold its replies met."""
    store = ObservationStore(retention_seconds=60, slice_seconds=10, refresh_seconds=0,
                             clock=lambda: 0.0)
    for _ in range(40):
        store.record(Observation("p/shortout", Outcome.OK, latency_ms=9_900, ttfb_ms=5_400,
                                 upstream_ms=9_900, output_tokens=214))
    mid = store.get("p/shortout", 60)
    old_basis = mid.p95_ttfb_ms + REFERENCE_OUTPUT_TOKENS * mid.p95_ms_per_output_token
    assert old_basis > 10_000
    assert mid.work_latency_ms == pytest.approx(9_900, rel=0.03)
    assert excluded(decide(GROUP, request(), snapshot(
        p__longout=LONG, p__shortout=mid, p__slow=SLOW))) == {
        "p/slow": "thresholds.max_p95_latency_ms"}
