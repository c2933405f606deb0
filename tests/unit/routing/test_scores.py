"""The six scores: bounded to [0, 1], 1 best, neutral 0.5 when disabled or unknown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.config.models import Target
from sidecar.config.policy import Signals
from sidecar.routing.capabilities import eval_quality
from sidecar.routing.observations import TargetObservations
from sidecar.routing.scores import Candidate, score_candidates

ALL = Signals()


def target(**fields) -> Target:
    return Target(provider="p", model_ref="m", **fields)


def candidate(cost=None, warm=True, **obs) -> Candidate:
    return Candidate(target(), TargetObservations(count=50 if warm else 0, **obs), warm, cost,
                     None)


def test_cost_score_is_cheapest_over_own_cost() -> None:
    scores = score_candidates([candidate(cost=0.01), candidate(cost=0.04), candidate()], ALL, None)
    assert [s["cost_score"] for s in scores] == [1.0, 0.25, 0.5]


def test_cost_score_free_beats_paid() -> None:
    scores = score_candidates([candidate(cost=0.0), candidate(cost=0.5)], ALL, None)
    assert [s["cost_score"] for s in scores] == [1.0, 0.0]


def test_latency_throughput_reliability_from_warm_observations_only() -> None:
    scores = score_candidates([
        candidate(p95_latency_ms=500, output_tokens_per_s=100, error_rate=0.1),
        candidate(p95_latency_ms=1000, output_tokens_per_s=50, timeout_rate=0.05,
                  fallback_rate=0.05),
        candidate(warm=False, p95_latency_ms=1, output_tokens_per_s=1000),
    ], ALL, None)
    assert [s["latency_score"] for s in scores] == [1.0, 0.5, 0.5]
    assert [s["throughput_score"] for s in scores] == [1.0, 0.5, 0.5]
    assert [s["reliability_score"] for s in scores] == pytest.approx([0.9, 0.9, 0.5])


def test_complexity_and_eval_quality_scores() -> None:
    evaluated_target = target(evaluation={"quality_score": 0.9, "pass_rate": 0.7})
    evaluated = Candidate(evaluated_target, TargetObservations(), False, None,
                          eval_quality(evaluated_target))
    scores = score_candidates([evaluated, candidate()], ALL, 0.5)
    assert scores[0]["eval_quality_score"] == pytest.approx(0.8)
    assert scores[1]["eval_quality_score"] == 0.5
    assert {s["complexity_score"] for s in scores} == {0.5}


@pytest.mark.parametrize(("signal", "score"), [
    ("cost", "cost_score"), ("observed_performance", "latency_score"),
    ("observed_performance", "reliability_score"), ("evaluation_metadata", "eval_quality_score"),
])
def test_a_disabled_signal_gives_the_neutral_score(signal: str, score: str) -> None:
    off = Signals.model_validate({signal: {"enabled": False}})
    evaluated = target(evaluation={"quality_score": 1.0})
    scores = score_candidates([
        Candidate(evaluated, TargetObservations(count=50, p95_latency_ms=10, error_rate=0.5),
                  True, 0.001, eval_quality(evaluated)),
        candidate(cost=1.0, p95_latency_ms=99),
    ], off, None)
    assert [s[score] for s in scores] == [0.5, 0.5]


@given(st.lists(st.tuples(
    st.one_of(st.none(), st.floats(0, 10)), st.booleans(),
    st.one_of(st.none(), st.floats(0, 1e5)), st.one_of(st.none(), st.floats(0, 1e4)),
    st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6),
    st.one_of(st.none(), st.floats(0, 1)))
def test_every_score_is_bounded(rows, complexity_score) -> None:
    candidates = [candidate(cost=c, warm=w, p95_latency_ms=lat, output_tokens_per_s=tps,
                            error_rate=e, timeout_rate=t, fallback_rate=f)
                  for c, w, lat, tps, e, t, f in rows]
    for scores in score_candidates(candidates, ALL, complexity_score):
        assert all(0.0 <= value <= 1.0 for value in scores.values())


def test_the_cost_estimate_prices_the_observed_cache_share_at_the_cache_price() -> None:
    """The same rule as the bill: a target whose input mostly comes from its prompt cache is
    cheaper for the request than its plain input price says."""
    from sidecar.routing.scores import estimated_cost_usd
    cached = target(pricing={"input_per_mtok": 3.0, "cached_input_per_mtok": 0.3,
                             "output_per_mtok": 15.0})
    plain = target(pricing={"input_per_mtok": 1.0, "output_per_mtok": 15.0})
    assert estimated_cost_usd(cached, 10_000, 100) == pytest.approx((30_000 + 1_500) / 1e6)
    assert estimated_cost_usd(cached, 10_000, 100, 0.9) == pytest.approx(
        (1_000 * 3.0 + 9_000 * 0.3 + 1_500) / 1e6)
    assert estimated_cost_usd(cached, 10_000, 100, 0.9) < estimated_cost_usd(plain, 10_000, 100)
