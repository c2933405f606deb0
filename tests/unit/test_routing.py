"""The pure routing core: smooth weighted round-robin, strategies, eligibility."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from sidecar.apis import Dialect
from sidecar.config import load_config_text
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.request import RequestSummary
from sidecar.routing.router import Router
from sidecar.routing.weighted import SmoothWeightedRoundRobin


def test_smooth_round_robin_interleaves_60_25_5() -> None:
    rotation = SmoothWeightedRoundRobin([60, 25, 5])
    picks = [rotation.pick([0, 1, 2]) for _ in range(90)]
    assert Counter(picks) == {0: 60, 1: 25, 2: 5}
    # Interleaved, not 60 in a row: the longest run of the heaviest target is short.
    runs, current = [], 0
    for pick in picks:
        current = current + 1 if pick == 0 else 0
        runs.append(current)
    assert max(runs) <= 3
    # Deterministic: a fresh rotation repeats the exact sequence.
    again = SmoothWeightedRoundRobin([60, 25, 5])
    assert [again.pick([0, 1, 2]) for _ in range(90)] == picks


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=6).filter(any),
       st.integers(min_value=0, max_value=200))
def test_any_full_cycle_matches_the_weights_exactly(weights: list[int], offset: int) -> None:
    rotation = SmoothWeightedRoundRobin(weights)
    candidates = list(range(len(weights)))
    for _ in range(offset):
        rotation.pick(candidates)
    picks = Counter(rotation.pick(candidates) for _ in range(sum(weights)))
    assert {i: picks.get(i, 0) for i in candidates} == dict(enumerate(weights))


def test_round_robin_over_a_subset_uses_only_the_subset() -> None:
    rotation = SmoothWeightedRoundRobin([5, 3, 2])
    picks = Counter(rotation.pick([1, 2]) for _ in range(50))
    assert picks == {1: 30, 2: 20}


CONFIG = load_config_text("""
providers:
  anth-only: {base_url: "http://127.0.0.1:1/v1", dialects: [anthropic_messages]}
models:
  mixed:
    targets:
      - {provider: openai, model_ref: a, weight: 1}
      - {provider: anth-only, model_ref: b, weight: 5}
      - {provider: baseten, model_ref: c, weight: 3}
  ordered:
    strategy: failover
    targets:
      - {provider: baseten, model_ref: first, weight: 1}
      - {provider: openai, model_ref: second, weight: 9}
  scored:
    strategy: dynamic_score
    targets:
      - {provider: openai, model_ref: x, weight: 2}
      - {provider: baseten, model_ref: y, weight: 1}
""")


def request(group: str, dialect: Dialect = Dialect.OPENAI_CHAT) -> RequestSummary:
    return RequestSummary(group=group, caller="c", dialect=dialect)


def test_targets_speaking_another_dialect_are_excluded_and_traced() -> None:
    decision = Router(CONFIG).decide(request("mixed"))
    assert isinstance(decision, Decision)
    assert {c.target.model_ref for c in decision.ordered} == {"a", "c"}
    assert "excluded anth-only/b by api_skin" in decision.trace


def test_weighted_fallback_order_is_by_weight_then_declared_order() -> None:
    decision = Router(CONFIG).decide(request("mixed"))
    assert decision.primary.target.model_ref == "c"  # weight 3 beats 1 on the first pick
    assert [c.target.model_ref for c in decision.fallbacks] == ["a"]


def test_failover_keeps_declared_order_regardless_of_weight() -> None:
    router = Router(CONFIG)
    for _ in range(3):
        decision = router.decide(request("ordered"))
        assert [c.target.model_ref for c in decision.ordered] == ["first", "second"]
        assert "order=declared" in decision.trace


def test_dynamic_score_routes_by_weight_until_scoring_lands_and_says_so() -> None:
    router = Router(CONFIG)
    decisions = [router.decide(request("scored")) for _ in range(3)]
    assert Counter(d.primary.target.model_ref for d in decisions) == {"x": 2, "y": 1}
    assert "dynamic_score=not_scored_yet:configured_weight_order" in decisions[0].trace


def test_no_eligible_target_names_the_dialect() -> None:
    outcome = Router(CONFIG).decide(request("ordered", Dialect.ANTHROPIC_MESSAGES))
    assert isinstance(outcome, NoEligibleTarget)
    assert "anthropic_messages" in outcome.reason


def test_same_state_same_decisions() -> None:
    first, second = Router(CONFIG), Router(CONFIG)
    seq = [request(g) for g in ("mixed", "scored", "mixed", "ordered", "scored")] * 5
    assert [first.decide(r) for r in seq] == [second.decide(r) for r in seq]
