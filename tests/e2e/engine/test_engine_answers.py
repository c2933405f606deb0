"""What a caller gets from a real engine through the gateway (issue #40): llama.cpp's
`llama-server` behind real Envoy, the official SDKs as callers. Unary and streamed answers
as the engine wrote them, usage and cost as the engine counted them, caps, and tool calls
native and bridged."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.e2e.engine.conftest import PRICE_IN, PRICE_OUT, TOKEN, EngineStack, prompt

pytestmark = pytest.mark.e2e

# Enum-only arguments: the grammar llama.cpp derives leaves a random model little to ramble.
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Lima"]}}}}}
CLAUDE_WEATHER = {"name": "weather", "description": "Current weather in a city",
                  "input_schema": WEATHER["function"]["parameters"]}


def test_a_unary_answer_is_the_engines_with_its_usage_counted_and_priced(
        stack: EngineStack) -> None:
    started = time.time()
    ask = prompt()
    reply = stack.openai.chat.completions.create(model="engine", messages=ask, max_tokens=12,
                                                 seed=11)
    direct = stack.direct("big").chat.completions.create(model="tiny", messages=ask,
                                                         max_tokens=12, seed=11)
    assert reply.choices[0].message.content == direct.choices[0].message.content
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens == direct.usage.prompt_tokens
    row = stack.row("engine", started)
    assert row["serving_target"] == "big/tiny" and row["status"] == 200
    assert (row["input_tokens"], row["output_tokens"]) == (reply.usage.prompt_tokens, 12)
    assert row["cost_usd"] == pytest.approx(
        (reply.usage.prompt_tokens * PRICE_IN + 12 * PRICE_OUT) / 1e6)


def _stream_events(stack: EngineStack, body: dict) -> list[tuple[float, dict | str]]:
    """The caller's SSE events as they arrived: (seconds since the request, payload)."""
    events: list[tuple[float, dict | str]] = []
    started = time.monotonic()
    with httpx.stream("POST", stack.up.base_url + "/v1/chat/completions", json=body,
                      headers={"authorization": f"Bearer {TOKEN}"}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append((time.monotonic() - started,
                               data if data == "[DONE]" else json.loads(data)))
    return events


def test_a_stream_arrives_incrementally_as_the_engine_wrote_it_and_unasked_usage_never(
        stack: EngineStack) -> None:
    """The gateway asks the engine for usage on the caller's behalf (to count it); the caller
    that did not ask never sees the usage chunk, and every chunk it sees has a choice."""
    ask = prompt()
    started = time.time()
    events = _stream_events(stack, {"model": "engine", "messages": ask, "stream": True,
                                    "max_tokens": 800, "seed": 5})
    chunks = [payload for _, payload in events if isinstance(payload, dict)]
    assert events[-1][1] == "[DONE]"
    assert all(chunk["choices"] and "usage" not in chunk for chunk in chunks), [
        chunk for chunk in chunks if not chunk["choices"] or "usage" in chunk][:2]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    direct = stack.direct("big").chat.completions.create(
        model="tiny", messages=ask, max_tokens=800, seed=5, stream=True)
    assert text == "".join(c.choices[0].delta.content or "" for c in direct if c.choices)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # What the engine put on the usage chunk besides the usage (its `timings`) reaches the
    # caller on the finish chunk (issue 40, observation 6).
    assert chunks[-1]["timings"]["predicted_n"] == 800, chunks[-1]
    # Incremental: the first token reached the caller long before the last one.
    first_content = next(at for at, payload in events if isinstance(payload, dict)
                         and payload["choices"][0]["delta"].get("content"))
    assert first_content < events[-1][0] / 4, (first_content, events[-1][0])
    row = stack.row("engine", started)
    assert (row["output_tokens"], row["status"]) == (800, 200)


def test_a_stream_with_usage_asked_for_ends_with_the_engines_usage_and_the_row_agrees(
        stack: EngineStack) -> None:
    started = time.time()
    chunks = list(stack.openai.chat.completions.create(
        model="engine", messages=prompt(), max_tokens=20, stream=True,
        stream_options={"include_usage": True}))
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and not chunks[-1].choices
    usage = chunks[-1].usage
    assert usage.completion_tokens == 20 and usage.prompt_tokens > 0
    row = stack.row("engine", started)
    assert (row["input_tokens"], row["output_tokens"]) == (usage.prompt_tokens, 20)
    assert row["cost_usd"] == pytest.approx((usage.prompt_tokens * PRICE_IN
                                             + 20 * PRICE_OUT) / 1e6)


@pytest.mark.parametrize("cap", [1, 3])
def test_a_low_max_tokens_caps_the_answer_in_both_dialects(stack: EngineStack, cap: int) -> None:
    reply = stack.openai.chat.completions.create(model="engine", messages=prompt(),
                                                 max_tokens=cap)
    assert (reply.choices[0].finish_reason, reply.usage.completion_tokens) == ("length", cap)
    message = stack.anthropic.messages.create(model="engine-bridged", max_tokens=cap,
                                              messages=prompt())
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", cap)
    with stack.anthropic.messages.stream(model="engine-bridged", max_tokens=cap,
                                         messages=prompt()) as events:
        final = events.get_final_message()
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", cap)


def test_a_native_tool_call_comes_back_as_the_engine_made_it(stack: EngineStack) -> None:
    reply = stack.openai.chat.completions.create(
        model="engine", messages=prompt("weather?"), tools=[WEATHER], tool_choice="required",
        max_tokens=300)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "weather"
    assert json.loads(call.function.arguments)["city"] in ("Oslo", "Lima")


def test_a_bridged_tool_call_reaches_the_anthropic_caller_as_tool_use(
        stack: EngineStack) -> None:
    message = stack.anthropic.messages.create(
        model="engine-bridged", max_tokens=300, messages=prompt("weather?"),
        tools=[CLAUDE_WEATHER], tool_choice={"type": "any"})
    assert message.stop_reason == "tool_use", message
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "weather" and use.input["city"] in ("Oslo", "Lima")


def test_a_bridged_tool_call_cut_by_max_tokens_is_a_max_tokens_stop(stack: EngineStack) -> None:
    """The engines sample with a fixed seed, so the same request alone gets the same answer:
    the whole answer's length tells where a cap cuts into the call's arguments (its last
    ~20 tokens are the arguments' value, whitespace and the closing marker)."""
    ask = [{"role": "user", "content": "weather? cut me short"}]
    whole = stack.anthropic.messages.create(
        model="engine-bridged", max_tokens=300, messages=ask,
        tools=[CLAUDE_WEATHER], tool_choice={"type": "any"})
    assert whole.stop_reason == "tool_use"
    cap = whole.usage.output_tokens - 20
    started = time.time()
    message = stack.anthropic.messages.create(
        model="engine-bridged", max_tokens=cap, messages=ask,
        tools=[CLAUDE_WEATHER], tool_choice={"type": "any"})
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == cap
    row = stack.row("engine-bridged", started)
    assert (row["status"], row["attempts"]) == (200, 1)
