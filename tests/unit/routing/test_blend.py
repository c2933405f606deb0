"""`score_terms`, cold start and the capped blend, including the worked example of
docs/dynamic-score.md (the numbers there are asserted here)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.routing.blend import blended_shares, weight_shares
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, decide, excluded, request, snapshot, warm

WORKED = config("""
  worked-example:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 60, pricing: {input_per_mtok: 1, output_per_mtok: 4}}
      - {provider: p, model_ref: b, weight: 25, pricing: {input_per_mtok: 0.5, output_per_mtok: 2}}
      - {provider: p, model_ref: c, weight: 5}
    routing_policy:
      dynamic_score:
        min_observations: 20
        max_score_adjustment_percent: 70
        score_terms:
          - name: cheap_and_quick
            expression: "0.5 * cost_score + 0.5 * latency_score"
""")
WORKED_OBS = snapshot(p__a=warm(40, p95_latency_ms=2000), p__b=warm(40, p95_latency_ms=1000),
                      p__c=warm(5))
WORKED_REQUEST = request("worked-example", prompt_chars=4000, max_tokens_cap=1000)


def test_worked_example_scores_and_shares() -> None:
    trace = decide(WORKED, WORKED_REQUEST, WORKED_OBS).trace
    rows = {c.target: c for c in trace.candidates}
    assert trace.score_terms == ("cheap_and_quick",)
    assert trace.cold_start == "mixed"
    assert (rows["p/a"].scores["cost_score"], rows["p/a"].scores["latency_score"]) == (0.5, 0.5)
    assert (rows["p/b"].scores["cost_score"], rows["p/b"].scores["latency_score"]) == (1.0, 1.0)
    assert (rows["p/a"].term_value, rows["p/b"].term_value, rows["p/c"].term_value) == (
        0.5, 1.0, None)
    assert rows["p/a"].weight_share == pytest.approx(0.666667)
    assert rows["p/a"].final_share == pytest.approx(0.211891)
    assert rows["p/b"].final_share == pytest.approx(0.732554)
    assert rows["p/c"].final_share == pytest.approx(0.055556)
    assert trace.blend == {"adjustment": 0.7, "sharpness": 8.0}
    assert trace.to_dict()["blend"] == {"adjustment": 0.7, "sharpness": 8.0}
    buckets = {row["target"]: row["final_share_bucket"] for row in trace.to_dict()["candidates"]}
    assert buckets == {"p/a": "0.2-0.4", "p/b": "0.6-0.8", "p/c": "0.0-0.2"}


def test_worked_example_over_1000_decisions() -> None:
    router = Router(WORKED)
    counts = Counter(router.decide(WORKED_REQUEST, WORKED_OBS).primary.target.model_ref
                     for _ in range(1000))
    assert abs(counts["a"] - 211.89) <= 1
    assert abs(counts["b"] - 732.55) <= 1
    assert abs(counts["c"] - 55.56) <= 1


def test_fallback_order_is_by_final_share() -> None:
    decision = decide(WORKED, WORKED_REQUEST, WORKED_OBS)
    others = [c.target.model_ref for c in decision.ordered if c is not decision.primary]
    assert others == sorted(others, key=["b", "a", "c"].index)


def test_cold_start_all_cold_follows_the_weights_exactly() -> None:
    router = Router(WORKED)
    counts = Counter(router.decide(WORKED_REQUEST).primary.target.model_ref for _ in range(90))
    assert counts == {"a": 60, "b": 25, "c": 5}
    decision = router.decide(WORKED_REQUEST)
    assert decision.trace.cold_start == "all_cold"
    assert decision.trace.order == "weight_shares"
    assert [c.target.model_ref for c in decision.ordered[1:]] == sorted(
        [c.target.model_ref for c in decision.ordered[1:]], key=["a", "b", "c"].index)


def test_adjustment_zero_means_weights_only_and_100_means_scores_only() -> None:
    shares = weight_shares([60, 25, 5])
    assert blended_shares(shares, [True, True, False], [0.5, 1.0, None], 0.0) == (shares, False)
    full, moved = blended_shares(shares, [True, True, False], [0.5, 1.0, None], 1.0)
    pull = math.exp(-4)  # b is 0.5 better: e^(8·0.5) = e^4 times a's pull
    assert moved and full == pytest.approx(
        [17 / 18 * pull / (1 + pull), 17 / 18 / (1 + pull), 1 / 18])


def test_a_clearly_better_target_takes_most_of_the_adjustable_room() -> None:
    """Issue 14, item 1: with raw-proportional splitting a 0.88 target got only 1.5x the
    room of a 0.57 one. Now it takes most of it; near-equal targets split it evenly; and
    sharpness 0 splits it equally."""
    shares = weight_shares([1, 1, 1])
    final, _ = blended_shares(shares, [True] * 3, [0.88, 0.57, 0.57], 0.7)
    room = [f - 0.3 / 3 for f in final]  # what each got of the adjustable 0.7
    assert room[0] / sum(room) > 0.8
    assert room[0] / room[1] == pytest.approx(math.exp(8 * 0.31))
    close, _ = blended_shares(shares, [True] * 3, [0.60, 0.59, 0.58], 0.7)
    assert max(close) - min(close) < 0.06
    flat, _ = blended_shares(shares, [True] * 3, [0.9, 0.5, 0.1], 0.7, sharpness=0.0)
    assert flat == pytest.approx([1 / 3] * 3)


def test_no_term_value_or_all_zero_values_keep_the_weights() -> None:
    shares = weight_shares([3, 1])
    kept = (shares, False)
    assert blended_shares(shares, [True, True], [None, None], 0.7) == kept
    assert blended_shares(shares, [True, True], [0.0, 0.0], 0.7) == kept
    assert blended_shares(shares, [True, True], [-1.0, 0.0], 0.7) == kept  # negatives clamp
    assert blended_shares(shares, [True, True], [float("nan"), float("inf")], 0.7) == kept


TERMS = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: validated, weight: 1, tags: [validated]}
      - {provider: p, model_ref: plain, weight: 1}
    routing_policy:
      dynamic_score:
        score_terms:
          - {name: small, when: {complexity_lte: standard}, expression: "cost_score"}
          - {name: big, when: {complexity_gte: complex}, require_tags: [validated],
             expression: "eval_quality_score"}
          - {name: always, expression: "reliability_score"}
""")
COMPLEX_PROMPT = ('Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: 1\n'
                  "diff --git a/x.py b/x.py\n@@ -1 +1 @@\n```\ndef f(): pass\n```")


def test_score_terms_when_selects_by_complexity_and_several_terms_add_up() -> None:
    simple = decide(TERMS, request(prompt_sample="hello")).trace
    assert simple.score_terms == ("small", "always")
    assert simple.complexity == "simple"
    complex_ = decide(TERMS, request(prompt_sample=COMPLEX_PROMPT)).trace
    assert complex_.complexity == "complex"
    assert complex_.score_terms == ("big", "always")


def test_score_terms_require_tags_restricts_candidates_while_the_term_applies() -> None:
    decision = decide(TERMS, request(prompt_sample=COMPLEX_PROMPT))
    assert [c.target.model_ref for c in decision.ordered] == ["validated"]
    assert excluded(decision) == {"p/plain": "score_terms.require_tags"}
    assert len(decide(TERMS, request(prompt_sample="hello")).ordered) == 2


def test_require_tags_that_would_remove_everyone_is_relaxed() -> None:
    cfg = config("""
  g:
    strategy: dynamic_score
    targets: [{provider: p, model_ref: plain}]
    routing_policy:
      dynamic_score:
        score_terms: [{name: t, require_tags: [validated], expression: "1"}]
""")
    decision = decide(cfg, request())
    assert decision.primary.target.model_ref == "plain"
    assert decision.trace.require_tags_relaxed is True


def test_term_values_sum_when_several_terms_match() -> None:
    cfg = config("""
  g:
    strategy: dynamic_score
    targets: [{provider: p, model_ref: a}, {provider: p, model_ref: b}]
    routing_policy:
      dynamic_score:
        score_terms:
          - {name: one, expression: "0.25"}
          - {name: two, expression: "2 * complexity_score + 0.5"}
""")
    trace = decide(cfg, request(), snapshot(p__a=warm(), p__b=warm())).trace
    assert [c.term_value for c in trace.candidates] == [0.75, 0.75]


@given(st.lists(st.tuples(st.integers(0, 100), st.booleans(),
                          st.one_of(st.none(), st.floats(-1, 3), st.just(float("nan")))),
                min_size=1, max_size=8),
       st.floats(0, 1), st.floats(0, 100))
def test_blend_properties_for_any_sharpness(rows, adjustment, sharpness) -> None:
    """Shares sum to one, a warm target stays inside its capped band, a cold one keeps its
    weight share exactly, whatever the values and the sharpness."""
    weights, warm, values = zip(*rows, strict=True)
    shares = weight_shares(list(weights))
    final, moved = blended_shares(shares, list(warm), list(values), adjustment, sharpness)
    assert sum(final) == pytest.approx(1.0)
    warm_share = sum(s for s, hot in zip(shares, warm, strict=True) if hot)
    for share, hot, result in zip(shares, warm, final, strict=True):
        if hot and moved:
            assert (1 - adjustment) * share - 1e-12 <= result
            assert result <= (1 - adjustment) * share + adjustment * warm_share + 1e-12
        else:
            assert result == share
