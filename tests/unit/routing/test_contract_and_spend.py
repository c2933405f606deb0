"""`models.<group>.contract` (hard requirements and quality floors) and the caller's
`spend_ceiling_usd`; both run before any scoring, for every strategy."""

from __future__ import annotations

import pytest

from tests.unit.routing.helpers import config, decide, excluded, refuse, request

CONTRACT_GROUP = """
  g:
    strategy: {strategy}
    contract: {contract}
    targets:
      - provider: p
        model_ref: good
        tags: [validated]
        input_modalities: [text, image]
        context_window: 200000
        evaluation: {{quality_score: 0.9}}
        validation: {{status: passed, pass_rate: 0.97}}
      - provider: p
        model_ref: weak
        tags: [validated]
        input_modalities: [text]
        context_window: 32000
        evaluation: {{quality_score: 0.6}}
        validation: {{status: pending, pass_rate: 0.80}}
      - {{provider: p, model_ref: bare}}
"""


@pytest.mark.parametrize("strategy", ["weighted", "failover", "dynamic_score"])
@pytest.mark.parametrize(("contract", "stage_for_weak"), [
    ("{require_tags: [validated]}", None),
    ("{require_input_modalities: [image]}", "contract.require_input_modalities"),
    ("{min_context_window: 100000}", "contract.min_context_window"),
    ("{min_eval_quality_score: 0.8}", "contract.min_eval_quality_score"),
    ("{min_validation_pass_rate: 0.9}", "contract.min_validation_pass_rate"),
    ("{require_validation_status: passed}", "contract.require_validation_status"),
])
def test_contract_keys(strategy: str, contract: str, stage_for_weak: str | None) -> None:
    cfg = config(CONTRACT_GROUP.format(strategy=strategy, contract=contract))
    decision = decide(cfg, request())
    served = {c.target.model_ref for c in decision.ordered}
    assert "good" in served
    reasons = excluded(decision)
    assert reasons["p/bare"].startswith("contract.")  # unknown metadata never meets a floor
    if stage_for_weak is None:
        assert "weak" in served
    else:
        assert reasons["p/weak"] == stage_for_weak


def test_eval_quality_uses_validation_metadata_and_failed_validation_is_zero() -> None:
    cfg = config("""
  g:
    contract: {min_eval_quality_score: 0.75}
    targets:
      - {provider: p, model_ref: by-validation, validation: {pass_rate: 0.8}}
      - {provider: p, model_ref: failed, evaluation: {quality_score: 0.99},
         validation: {status: failed}}
""")
    decision = decide(cfg, request())
    assert [c.target.model_ref for c in decision.ordered] == ["by-validation"]


PRICED = config("""
  g:
    targets:
      - {provider: p, model_ref: cheap, pricing: {input_per_mtok: 0.1, output_per_mtok: 0.4}}
      - {provider: p, model_ref: dear, pricing: {input_per_mtok: 15, output_per_mtok: 75}}
      - {provider: p, model_ref: unpriced}
""")


def test_spend_ceiling_excludes_targets_estimated_above_it() -> None:
    # 40,000 chars ≈ 10,000 input tokens; cap 1,000 output tokens.
    # cheap: 10,000·0.1/1e6 + 1,000·0.4/1e6 = $0.0014; dear: 0.15 + 0.075 = $0.225.
    shape = {"prompt_chars": 40_000, "max_tokens_cap": 1_000}
    decision = decide(PRICED, request(spend_ceiling_usd=0.01, **shape))
    assert {c.target.model_ref for c in decision.ordered} == {"cheap", "unpriced"}
    assert excluded(decision) == {"p/dear": "spend_ceiling"}
    decision = decide(PRICED, request(spend_ceiling_usd=0.5, **shape))
    assert len(decision.ordered) == 3
    assert len(decide(PRICED, request(**shape)).ordered) == 3


def test_spend_ceiling_uses_a_default_output_budget_without_a_cap() -> None:
    # No cap: 1,024 output tokens assumed; dear costs 1,024·75/1e6 ≈ $0.077 on output alone.
    decision = decide(PRICED, request(spend_ceiling_usd=0.05))
    assert excluded(decision) == {"p/dear": "spend_ceiling"}


def test_nothing_under_the_ceiling_is_a_clear_refusal() -> None:
    cfg = config("""
  g:
    targets:
      - {provider: p, model_ref: dear, pricing: {input_per_mtok: 15, output_per_mtok: 75}}
""")
    outcome = refuse(cfg, request(spend_ceiling_usd=0.0001))
    assert "the estimated cost exceeds your spend ceiling" in outcome.reason


def test_a_target_whose_provider_asked_to_wait_is_left_out_until_then() -> None:
    """Every strategy: the target is excluded as `provider_retry_after`; when every target
    waits, the refusal says when the earliest is back (a 429 for the caller)."""
    from sidecar.routing.decision import Decision, NoEligibleTarget
    from sidecar.routing.observations import TargetObservations
    from sidecar.routing.router import Router
    from tests.unit.routing.helpers import snapshot

    cfg = config("""
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: a, weight: 9}
      - {provider: p, model_ref: b, weight: 1}
""")
    router = Router(cfg)
    waiting = snapshot(p__a=TargetObservations(retry_after_s=1.5))
    for _ in range(5):
        decision = router.decide(request(), waiting)
        assert isinstance(decision, Decision)
        assert [c.label for c in decision.ordered] == ["p/b"]
        assert excluded(decision) == {"p/a": "provider_retry_after"}
    both = snapshot(p__a=TargetObservations(retry_after_s=1.5),
                    p__b=TargetObservations(retry_after_s=0.4))
    refusal = router.decide(request(), both)
    assert isinstance(refusal, NoEligibleTarget)
    assert refusal.retry_after_s == pytest.approx(0.4)
    assert "rate limited by its provider" in refusal.reason


def test_a_request_that_cannot_fit_a_declared_context_window_is_not_sent_there() -> None:
    """`context_window_tokens` (or its older name `context_window`): estimated prompt (4
    characters a token) plus the output cap; unknown windows take everything."""
    cfg = config("""
  g:
    strategy: failover
    targets:
      - {provider: p, model_ref: small, context_window_tokens: 1000}
      - {provider: p, model_ref: old-name, context_window: 1000}
      - {provider: p, model_ref: unknown}
""")
    fits = decide(cfg, request(prompt_chars=3000, max_tokens_cap=200))
    assert [c.label for c in fits.ordered] == ["p/small", "p/old-name", "p/unknown"]
    over = decide(cfg, request(prompt_chars=3000, max_tokens_cap=300))
    assert [c.label for c in over.ordered] == ["p/unknown"]
    assert excluded(over) == {"p/small": "eligibility.context_window_tokens",
                              "p/old-name": "eligibility.context_window_tokens"}
    only_small = config("""
  g:
    targets: [{provider: p, model_ref: small, context_window_tokens: 10}]
""")
    assert "do not fit any target's context window" in refuse(
        only_small, request(prompt_chars=400)).reason


def test_retry_same_target_repeats_no_target_in_the_order_itself() -> None:
    """A same-target repeat is earned by a held 5xx or 429 where Envoy sees it
    (test_attempt_order_after_refusal.py); the order is the decision's, round again."""
    from sidecar.config.models import Fallback
    assert Fallback().attempt_order("abc") == ["a", "b", "c"]
    assert Fallback(retry_same_target=1).attempt_order("abc") == ["a", "b", "c"]
    assert Fallback(retry_same_target=1, max_attempts=5).attempt_order("abc") == [
        "a", "b", "c", "a", "b"]
    assert Fallback(retry_same_target=2, max_attempts=1).attempt_order("ab") == ["a"]
    # Fewer targets than attempts: round them again (issue #31).
    assert Fallback().attempt_order("ab") == ["a", "b", "a"]
    # One target: a second try at it (on the route that retries 5xx only, never a 429),
    # whatever retry_same_target says (issue 40: it defaults to 1, and the group's own
    # route would retry a lone target's 429 at once), more if it asks for more, unless
    # the group allows one attempt.
    assert Fallback().attempt_order("a") == ["a", "a"]
    assert Fallback().retries_lone_target(1) and not Fallback().retries_lone_target(2)
    assert Fallback(retry_same_target=0).retries_lone_target(1)
    assert not Fallback(max_attempts=1).retries_lone_target(1)
    assert Fallback(retry_same_target=0).attempt_order("a") == ["a", "a"]
    assert Fallback(retry_same_target=2).attempt_order("a") == ["a", "a", "a"]
    assert Fallback(retry_same_target=3).attempt_order("a") == ["a", "a", "a"]
    assert Fallback(max_attempts=1).attempt_order("a") == ["a"]
    assert Fallback().attempt_order("") == []
