"""The SPEC sample group under `strategy: dynamic_score`, through real Envoy and the OpenAI
SDK: score terms by prompt complexity (seen in the sidecar's decision log), and the hard
filters keeping tool, capped and image requests away from targets that cannot serve them."""

from __future__ import annotations

import openai
import pytest

from sidecar.devstack.harness import ProviderThread
from tests.e2e.conftest import TOKEN_A, Stack

pytestmark = pytest.mark.e2e

SPEC_PROVIDERS = ("baseten", "minimax", "openai")
DEBUG_PROMPT = """My service crashes. Here is the trace and the change I made.

Traceback (most recent call last):
  File "service/handler.py", line 42, in handle
    order = orders[order_id]
KeyError: 'A-1001'

diff --git a/service/handler.py b/service/handler.py
@@ -40,3 +40,3 @@
-    order = orders.get(order_id)
+    order = orders[order_id]
"""
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=TOKEN_A, max_retries=0)


def served_by(providers: ProviderThread) -> list[str]:
    return [name for name in SPEC_PROVIDERS for _ in providers.provider(name).received]


def test_simple_and_complex_prompts_take_different_score_terms(
    stack: Stack, providers: ProviderThread
) -> None:
    offset = stack.log_size()
    client(stack).chat.completions.create(
        model="adaptive-agent", messages=[{"role": "user", "content": "Say hello."}])
    client(stack).chat.completions.create(
        model="adaptive-agent", messages=[{"role": "user", "content": DEBUG_PROMPT}])
    simple, complex_ = (d["trace"] for d in stack.decisions_since(offset))
    assert (simple["complexity"], simple["score_terms"]) == ("simple", ["cheapest_fast_enough"])
    assert complex_["complexity"] == "complex"
    assert complex_["score_terms"] == ["complex_quality_floor"]
    assert {"stack_trace", "diff"} <= set(complex_["prompt_features"])
    # complex_quality_floor requires the `validated` tag: the fallback target is out.
    assert {"target": "openai/gpt-5.4-nano", "stage": "score_terms.require_tags"} in (
        complex_["exclusions"])
    assert simple["strategy"] == "dynamic_score" and simple["cold_start"] == "all_cold"
    assert len(served_by(providers)) == 2


def test_tool_requests_never_reach_a_target_without_tool_support(
    stack: Stack, providers: ProviderThread
) -> None:
    offset = stack.log_size()
    for i in range(30):  # distinct conversations, so affinity does not pin them all
        client(stack).chat.completions.create(
            model="adaptive-agent", messages=[{"role": "user", "content": f"weather {i}?"}],
            tools=TOOLS)
    assert "openai" not in served_by(providers)
    assert set(served_by(providers)) == {"baseten", "minimax"}
    for decision in stack.decisions_since(offset):
        assert {"target": "openai/gpt-5.4-nano",
                "stage": "hard_filters.require_tool_support_when_tools_present"} in (
            decision["trace"]["exclusions"])


def test_max_completion_tokens_1_never_reaches_a_target_that_ignores_caps(
    stack: Stack, providers: ProviderThread
) -> None:
    for i in range(30):
        reply = client(stack).chat.completions.create(
            model="adaptive-agent-meta", max_completion_tokens=1,
            messages=[{"role": "user", "content": f"One word, #{i}."}])
        assert reply.choices[0].finish_reason == "length"
    assert "minimax" not in served_by(providers)
    assert set(served_by(providers)) == {"baseten", "openai"}
    received = [r.json() for r in providers.provider("baseten").received]
    assert all(body["max_completion_tokens"] == 1 for body in received)


def test_image_requests_never_reach_a_text_only_target(
    stack: Stack, providers: ProviderThread
) -> None:
    for i in range(10):
        content = [{"type": "text", "text": f"What is in picture {i}?"}, IMAGE]
        client(stack).chat.completions.create(
            model="adaptive-agent-meta", messages=[{"role": "user", "content": content}])
    assert served_by(providers) == ["baseten"] * 10


def test_image_request_to_a_group_with_no_declared_image_target_is_refused(
    stack: Stack, providers: ProviderThread
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack).chat.completions.create(
            model="adaptive-agent",
            messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}])
    assert "image input needs a target that accepts images" in caught.value.body["message"]
    assert served_by(providers) == []


def test_forced_tool_requests_keep_their_choice_and_reach_only_tool_targets(
    stack: Stack, providers: ProviderThread
) -> None:
    """The SPEC's rollout list names forced tool requests (issue 42: parsed and bucketed,
    never sent through a `dynamic_score` group end to end)."""
    offset = stack.log_size()
    choices = ("required", {"type": "function", "function": {"name": "lookup"}})
    for i in range(20):
        choice = choices[i % 2]
        reply = client(stack).chat.completions.create(
            model="adaptive-agent", tools=TOOLS, tool_choice=choice,
            messages=[{"role": "user", "content": f"Look up order {i}."}])
        assert reply.choices[0].message.content  # answered (these fakes call no tools)
    assert set(served_by(providers)) <= {"baseten", "minimax"}
    sent = [r.json()["tool_choice"] for name in ("baseten", "minimax")
            for r in providers.provider(name).received]
    assert sorted(map(str, sent)) == sorted(str(choices[i % 2]) for i in range(20))
    decisions = stack.decisions_since(offset)
    assert len(decisions) == 20
    for decision in decisions:
        trace = decision["trace"]
        assert trace["request_shape"]["tools"] == "forced"
        assert {"target": "openai/gpt-5.4-nano",
                "stage": "hard_filters.require_tool_support_when_tools_present"} in (
            trace["exclusions"])


def test_reasoning_requests_reach_only_a_target_that_declares_reasoning(
    stack: Stack, providers: ProviderThread
) -> None:
    """The SPEC's rollout list names reasoning requests "where supported" (issue 42: tested
    only in a script group). The meta group's baseten target declares reasoning; without
    the (default-off) hard filter the baseline rule keeps the others out, and a group where
    no target declares it refuses in the caller's words."""
    offset = stack.log_size()
    for i in range(10):
        client(stack).chat.completions.create(
            model="adaptive-agent-meta", reasoning_effort="high",
            messages=[{"role": "user", "content": f"Think about puzzle {i}."}])
    assert served_by(providers) == ["baseten"] * 10
    assert all(r.json()["reasoning_effort"] == "high"
               for r in providers.provider("baseten").received)
    for decision in stack.decisions_since(offset):
        trace = decision["trace"]
        assert trace["reasoning"]["effort"] == "high"
        excluded = {(e["target"], e["stage"]) for e in trace["exclusions"]}
        assert {("minimax/m3", "eligibility.reasoning_metadata"),
                ("openai/gpt-5.4-nano", "eligibility.reasoning_metadata")} <= excluded
    with pytest.raises(openai.BadRequestError) as caught:
        client(stack).chat.completions.create(
            model="adaptive-agent", reasoning_effort="low",
            messages=[{"role": "user", "content": "Think hard."}])
    assert "reasoning/thinking needs a target with reasoning support" in (
        caught.value.body["message"])
    assert len(served_by(providers)) == 10
