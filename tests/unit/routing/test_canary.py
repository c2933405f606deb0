"""A group's canary in the routing core: which side decides, what each side may route to,
and what a withdrawal changes (routing/canary.py, config/rollout.py)."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from sidecar.config import ConfigError
from sidecar.config.models import CANARY_ONLY
from sidecar.routing.canary import CANARY, LIVE, WITHDRAWN
from sidecar.routing.decision import Decision
from sidecar.routing.policy_version import policy_version
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request

GROUP = """
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: old, weight: 1}
      - {provider: q, model_ref: new, weight: 1}
    rollout:
      canary:
        share_percent: %s
        targets: [q/new]
        weights: {p/old: 0}
        guards: {max_error_rate: 0.1}
"""
PLAIN = """
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: old, weight: 1}
"""


def key(n: int) -> bytes:
    return hashlib.sha256(str(n).encode()).digest()


def test_the_share_is_taken_per_conversation_and_every_turn_stays_on_its_side() -> None:
    router = Router(config(GROUP % 10))
    sides = Counter()
    for n in range(4000):
        decision = router.decide(request(conversation_key=key(n)))
        assert isinstance(decision, Decision)
        sides[decision.trace.canary] += 1
        # The candidate routes only to the new target (the old has weight 0 there), the
        # live side never to it.
        labels = [choice.label for choice in decision.ordered]
        if decision.trace.canary == CANARY:
            assert labels[0] == "q/new"
        else:
            assert labels == ["p/old"]
            assert ("q/new", CANARY_ONLY) in decision.trace.exclusions
    assert sides[CANARY] / 4000 == pytest.approx(0.10, abs=0.015)
    # The same conversation, decided again (a later turn, another replica): the same side.
    again = Router(config(GROUP % 10))
    for n in range(200):
        first = router.decide(request(conversation_key=key(n)))
        second = again.decide(request(conversation_key=key(n)))
        assert first.trace.canary == second.trace.canary


def test_requests_without_a_conversation_take_one_in_every_100_over_n() -> None:
    router = Router(config(GROUP % 25))
    sides = [router.decide(request()).trace.canary for _ in range(400)]
    assert sides.count(CANARY) == 100
    assert sides[:4] == [LIVE, LIVE, LIVE, CANARY]


def test_each_side_names_its_policy_and_the_live_one_is_the_group_before_the_canary() -> None:
    cfg = config(GROUP % 50)
    router = Router(cfg)
    versions = {router.decide(request(conversation_key=key(n))).trace.canary:
                router.decide(request(conversation_key=key(n))).trace.policy_version
                for n in range(50)}
    assert versions[LIVE] == policy_version(config(PLAIN).models["g"])
    assert versions[CANARY] == router.canary("g").policy_version != versions[LIVE]


def test_a_withdrawn_canary_sends_its_conversations_to_the_live_side_named_so() -> None:
    router = Router(config(GROUP % 50))
    canary_keys = [key(n) for n in range(100)
                   if router.decide(request(conversation_key=key(n))).trace.canary == CANARY]
    assert canary_keys
    router.canary("g").withdrawn = True
    for conversation in canary_keys:
        decision = router.decide(request(conversation_key=conversation))
        assert decision.trace.canary == WITHDRAWN
        assert [choice.label for choice in decision.ordered] == ["p/old"]
        assert decision.trace.policy_version == policy_version(config(PLAIN).models["g"])


def test_a_reload_keeps_a_withdrawal_of_the_same_candidate_only() -> None:
    before = Router(config(GROUP % 10))
    before.canary("g").withdrawn = True
    same = Router(config(GROUP % 20))   # the share changed, the candidate did not
    same.carry_over(before)
    assert same.canary("g").withdrawn
    # An edit of the live side (here its description) is the same canary too.
    edited = Router(config((GROUP % 10).replace("    strategy: weighted\n",
                                                "    strategy: weighted\n"
                                                "    description: edited\n", 1)))
    edited.carry_over(before)
    assert edited.canary("g").withdrawn
    other = Router(config((GROUP % 10).replace("p/old: 0", "p/old: 1")))
    other.carry_over(before)
    assert not other.canary("g").withdrawn


def test_groups_without_a_canary_have_no_side_in_their_trace() -> None:
    decision = Router(config(PLAIN)).decide(request())
    assert decision.trace.canary is None
    assert "canary" not in decision.trace.to_dict()


@pytest.mark.parametrize(("rollout", "message"), [
    ("{share_percent: 5, targets: [p/none], guards: {max_error_rate: 0.1}}",
     "names no target"),
    ("{share_percent: 5, targets: [p/old, q/new], guards: {max_error_rate: 0.1}}",
     "live side would have none"),
    ("{share_percent: 5, guards: {max_error_rate: 0.1}}", "changes nothing"),
    ("{share_percent: 5, targets: [q/new], guards: {}}", "at least one guard"),
    ("{share_percent: 60, targets: [q/new], guards: {max_error_rate: 0.1}}", "50"),
    ("{share_percent: 5, targets: [q/new], weights: {p/old: 0, q/new: 0}, "
     "guards: {max_error_rate: 0.1}}", "no target with a weight above 0"),
])
def test_a_canary_that_cannot_work_is_refused_with_its_reason(rollout: str, message: str) -> None:
    text = (GROUP % 10).split("    rollout:")[0] + f"    rollout: {{canary: {rollout}}}\n"
    with pytest.raises(ConfigError, match=message):
        config(text)


def test_a_weighted_groups_conversations_keep_their_side_through_the_gateways_key() -> None:
    """The key is the gateway's own (affinity_key), which a weighted group without a canary
    does not compute: every turn of a conversation lands on the same side."""
    from sidecar.dialects.apis import Dialect
    from sidecar.gateway.handler import affinity_key

    cfg = config(GROUP % 50)
    group = cfg.models["g"]
    assert affinity_key("c", "g", config(PLAIN).models["g"], Dialect.OPENAI_CHAT,
                        {"messages": [{"role": "user", "content": "hi"}]}) is None
    router = Router(cfg)
    for n in range(40):
        opening = [{"role": "user", "content": f"question {n}"}]
        turns = [opening, [*opening, {"role": "assistant", "content": "an answer"},
                           {"role": "user", "content": "and then?"}]]
        sides = {router.decide(request(conversation_key=affinity_key(
            "c", "g", group, Dialect.OPENAI_CHAT, {"messages": turn}))).trace.canary
            for turn in turns}
        assert len(sides) == 1, n


def test_a_canary_needs_observations() -> None:
    from sidecar.config import load_config_text
    from tests.unit.routing.helpers import PROVIDERS

    with pytest.raises(ConfigError, match=r"rollout\.canary needs observations"):
        load_config_text(PROVIDERS + "observations: {enabled: false}\nmodels:\n"
                         + GROUP % 10)
