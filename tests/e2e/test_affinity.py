"""Conversation affinity through real Envoy and the OpenAI SDK: a multi-turn conversation
stays on its target, callers are isolated, and an expired pin is re-selected."""

from __future__ import annotations

import time

import openai
import pytest

from sidecar.devstack.harness import ProviderThread
from tests.e2e.conftest import TOKEN_A, TOKEN_B, Stack

pytestmark = pytest.mark.e2e
GROUP = "affinity-agent"  # three equal-weight targets, affinity TTL 2 s


def client(stack: Stack, token: str = TOKEN_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=token, max_retries=0)


def converse(stack: Stack, history: list[dict], token: str = TOKEN_A) -> str:
    reply = client(stack, token).chat.completions.create(model=GROUP, messages=history)
    history.append({"role": "assistant", "content": reply.choices[0].message.content})
    return reply.model


def test_a_conversation_stays_on_one_target_while_others_spread(
    stack: Stack, providers: ProviderThread
) -> None:
    offset = stack.log_size()
    history = [{"role": "system", "content": "You are helpful."},
               {"role": "user", "content": "Let's debug my parser."}]
    served = []
    for turn in range(6):
        served.append(converse(stack, history))
        history.append({"role": "user", "content": f"Next step {turn}?"})
    assert len(set(served)) == 1
    outcomes = [d["trace"]["affinity"] for d in stack.decisions_since(offset)]
    assert outcomes == ["miss_created"] + ["hit"] * 5
    # Without the pin the rotation spreads conversations over all three targets.
    others = {converse(stack, [{"role": "user", "content": f"Unrelated {i}"}])
              for i in range(6)}
    assert len(others) == 3


def test_another_caller_with_the_same_conversation_is_routed_independently(
    stack: Stack, providers: ProviderThread
) -> None:
    opening = [{"role": "user", "content": "Shared opening words."}]
    converse(stack, list(opening), TOKEN_A)
    offset = stack.log_size()
    converse(stack, list(opening), TOKEN_B)
    (decision,) = stack.decisions_since(offset)
    assert decision["caller"] == "team-b"
    assert decision["trace"]["affinity"] == "miss_created"


def test_after_ttl_expiry_the_next_turn_is_reselected(
    stack: Stack, providers: ProviderThread
) -> None:
    history = [{"role": "user", "content": "A conversation that will idle."}]
    converse(stack, history)
    history.append({"role": "user", "content": "still there?"})
    offset = stack.log_size()
    converse(stack, history)
    time.sleep(2.1)  # the test config's TTL is 2 s (real Envoy, real clock)
    history.append({"role": "user", "content": "and now?"})
    converse(stack, history)
    outcomes = [d["trace"]["affinity"] for d in stack.decisions_since(offset)]
    assert outcomes == ["hit", "expired_replaced"]
