"""Every decision's odds (issue #31): each candidate's probability of being the primary,
and the chosen primary's probability with its reason, for every strategy. The odds are
what the strategy's own selection realises: over many decisions with the same inputs each
candidate is chosen at its probability (within one request: the rotation's bound)."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from sidecar.routing.decision import Decision
from sidecar.routing.policy_version import policy_version
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request, snapshot, warm
from tests.unit.routing.test_properties import (
    FAST,
    build,
    observations,
    policies,
    requests,
    snapshot_for,
    targets,
)


@FAST
@given(targets, policies, requests, observations,
       st.sampled_from(["weighted", "failover", "dynamic_score"]))
def test_odds_sum_to_one_and_name_the_primary(tl, policy, req, obs, strategy):
    cfg = build(tl, policy, strategy)
    outcome = Router(cfg).decide(req, snapshot_for(cfg, obs))
    if not isinstance(outcome, Decision):
        return
    trace = outcome.trace
    odds = dict(trace.odds)
    # Every candidate has odds; targets health kept out follow as last resorts, at 0.
    assert set(odds) <= {c.label for c in outcome.ordered}
    assert outcome.primary.label in odds or trace.selection[1] == "probe"
    assert math.isclose(sum(odds.values()), 1.0, abs_tol=1e-5)
    probability, reason = trace.selection
    if reason in ("pin", "probe", "declared_order", "script_rule", "external"):
        assert probability == 1.0
    else:
        assert reason in ("blend", "weights")
        assert probability == odds[outcome.primary.label] > 0
    assert trace.policy_version == policy_version(cfg.models["g"])


@FAST
@given(targets, policies, requests, observations, st.sampled_from(["weighted",
                                                                    "dynamic_score"]))
def test_each_candidate_is_chosen_at_its_odds(tl, policy, req, obs, strategy):
    policy = {**policy, "affinity": {"enabled": False}}
    cfg = build(tl, policy, strategy)
    router = Router(cfg)
    view = snapshot_for(cfg, obs)
    first = router.decide(req, view)
    if not isinstance(first, Decision) or first.trace.probe is not None:
        return
    counts = Counter({first.primary.label: 1})
    for _ in range(499):
        counts[router.decide(req, view).primary.label] += 1
    for target, probability in first.trace.odds:
        assert abs(counts[target] - 500 * probability) <= 1.0 + 500 * 1e-5


GROUP = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 3}
      - {provider: p, model_ref: b, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 5
        score_terms:
          - {name: fast, expression: "latency_score"}
""")


def test_a_pinned_turn_is_chosen_with_certainty_and_says_why() -> None:
    router = Router(GROUP)
    view = snapshot(p__a=warm(p95_latency_ms=900), p__b=warm(p95_latency_ms=300))
    turn = request(conversation_key=b"k" * 32)
    first = router.decide(turn, view)
    assert first.trace.selection[1] == "blend"
    assert first.trace.selection[0] == dict(first.trace.odds)[first.primary.label] < 1
    again = router.decide(turn, view)
    assert again.trace.selection == (1.0, "pin")
    assert again.trace.to_dict()["selection"] == {"probability": 1.0, "reason": "pin"}
    assert again.trace.to_dict()["odds"] == [
        {"target": t, "probability": p} for t, p in first.trace.odds]


def test_the_policy_version_changes_with_the_group_and_only_then() -> None:
    same = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 3}
      - {provider: p, model_ref: b, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 5
        score_terms:
          - {name: fast, expression: "latency_score"}
""")
    other = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 3}
      - {provider: p, model_ref: b, weight: 2}
    routing_policy:
      dynamic_score:
        min_observations: 5
        score_terms:
          - {name: fast, expression: "latency_score"}
""")
    version = policy_version(GROUP.models["g"])
    assert len(version) == 12 and int(version, 16) >= 0
    assert policy_version(same.models["g"]) == version
    assert policy_version(other.models["g"]) != version
