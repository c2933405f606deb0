"""Scope and the non-scoring strategies: `weighted` and `failover`."""

from __future__ import annotations

from collections import Counter

from sidecar.dialects.apis import Dialect
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, decide, excluded, refuse, request

CFG = config("""
  mixed:
    targets:
      - {provider: q, model_ref: a, weight: 1}
      - {provider: anth-only, model_ref: b, weight: 5}
      - {provider: p, model_ref: c, weight: 3}
  ordered:
    strategy: failover
    targets:
      - {provider: p, model_ref: first, weight: 1}
      - {provider: q, model_ref: second, weight: 9}
  other:
    targets:
      - {provider: q, model_ref: elsewhere, weight: 100}
""")


def test_scope_only_the_requested_groups_targets_are_considered() -> None:
    router = Router(CFG)
    seen = {router.decide(request("mixed")).primary.target.model_ref for _ in range(20)}
    assert seen == {"a", "c"}
    assert "elsewhere" not in {c.target.model_ref for c in decide(CFG, request("mixed")).ordered}


def test_weighted_targets_of_another_dialect_are_excluded_and_traced() -> None:
    decision = decide(CFG, request("mixed"))
    assert {c.target.model_ref for c in decision.ordered} == {"a", "c"}
    assert excluded(decision) == {"anth-only/b": "eligibility.api_skin"}
    assert decision.trace.order == "weighted_rotation"


def test_weighted_fallback_order_is_by_weight_then_declared_order() -> None:
    decision = decide(CFG, request("mixed"))
    assert decision.primary.target.model_ref == "c"
    assert [c.target.model_ref for c in decision.fallbacks] == ["a"]


def test_weighted_primary_follows_the_weights_over_a_cycle() -> None:
    router = Router(CFG)
    picks = Counter(router.decide(request("mixed")).primary.target.model_ref for _ in range(8))
    assert picks == {"c": 6, "a": 2}


def test_failover_keeps_declared_order_regardless_of_weight() -> None:
    router = Router(CFG)
    for _ in range(3):
        decision = router.decide(request("ordered"))
        assert [c.target.model_ref for c in decision.ordered] == ["first", "second"]
        assert decision.trace.order == "declared"


def test_no_eligible_target_names_the_dialect_not_the_targets() -> None:
    outcome = refuse(CFG, request("other", Dialect.ANTHROPIC_MESSAGES))
    assert outcome.reason == ("No target of model group 'other' can serve this request: "
                              "none speaks the anthropic_messages API.")
    assert "elsewhere" not in outcome.reason
