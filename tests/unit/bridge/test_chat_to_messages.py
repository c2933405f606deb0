"""OpenAI Chat → Anthropic Messages: realistic requests and answers (docs/dialects.md §2, §4)."""

from __future__ import annotations

import pytest

from sidecar.bridge import UnreadableAnswer, Untranslatable
from sidecar.bridge.chat_to_messages import request, response

PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
       "AAAABJRU5ErkJggg==")
AGENT_TURNS = {
    "model": "agent-group",
    "messages": [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "What is in these pictures, and the weather?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg",
                                                "detail": "high"}}]},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Bergen"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 °C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "9 °C"}]},
        {"role": "user", "content": "Thanks. Which is warmer?", "name": "ola"},
    ],
    "tools": [{"type": "function", "function": {
        "name": "weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True}}],
    "tool_choice": {"type": "function", "function": {"name": "weather"}},
    "parallel_tool_calls": False,
    "stop": "END",
    "temperature": 0.2,
    "max_completion_tokens": 300,
    "user": "user-42",
    "metadata": {"ticket": "T-1"},
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_a_multi_turn_tool_conversation_with_images_is_translated() -> None:
    out = request(AGENT_TURNS)
    assert out["system"] == "You are a careful agent.\n\nUse tools."
    assert out["max_tokens"] == 300 and out["temperature"] == 0.2
    assert out["stop_sequences"] == ["END"] and out["metadata"] == {"user_id": "user-42"}
    assert out["stream"] is False  # unary upstream; the caller's stream is synthesized
    first, second, third = out["messages"]
    assert first["role"] == "user" and [b["type"] for b in first["content"]] == [
        "text", "image", "image"]
    assert first["content"][1]["source"] == {"type": "base64", "media_type": "image/png",
                                             "data": PNG}
    assert first["content"][2]["source"] == {"type": "url", "url": "https://example.com/cat.jpg"}
    assert second == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Bergen"}}]}
    # Both tool results and the user's next words share one user turn.
    assert third["role"] == "user" and third["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "3 °C"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "9 °C"},
        {"type": "text", "text": "Thanks. Which is warmer?"}]
    assert out["tools"] == [{"name": "weather", "description": "Current weather",
                             "input_schema": AGENT_TURNS["tools"][0]["function"]["parameters"]}]
    assert out["tool_choice"] == {"type": "tool", "name": "weather",
                                  "disable_parallel_tool_use": True}
    assert "stream_options" not in out and "user" not in out


def test_defaults_and_tool_choices() -> None:
    simple = request({"model": "g", "messages": [{"role": "user", "content": "hi"}]})
    assert simple == {"model": "g", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}], "max_tokens": 4096, "stream": False}
    for choice, expected in (("auto", {"type": "auto"}), ("required", {"type": "any"}),
                             ("none", {"type": "none"})):
        body = {"model": "g", "messages": [{"role": "user", "content": "x"}],
                "tool_choice": choice}
        assert request(body)["tool_choice"] == expected


def test_reasoning_effort_becomes_a_thinking_budget_on_top_of_max_tokens() -> None:
    out = request({"model": "g", "messages": [{"role": "user", "content": "x"}],
                   "reasoning_effort": "medium", "max_tokens": 1000})
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert out["max_tokens"] == 9192
    assert "thinking" not in request({"model": "g", "reasoning_effort": "minimal",
                                      "messages": [{"role": "user", "content": "x"}]})


@pytest.mark.parametrize(("change", "field"), [
    ({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"seed": 7}, "seed"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"temperature": 1.5}, "temperature"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"reasoning_effort": "high", "temperature": 0.3}, "reasoning_effort"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]},
     "messages[1].role"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"a_new_openai_field": 1}, "a_new_openai_field"),
])
def test_what_anthropic_cannot_express_is_named_not_dropped(change: dict, field: str) -> None:
    body = {"model": "g", "messages": [{"role": "user", "content": "x"}]} | change
    with pytest.raises(Untranslatable) as raised:
        request(body)
    assert raised.value.field == field


def test_an_answer_with_text_tool_use_thinking_and_cache_usage() -> None:
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
              "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                          {"type": "text", "text": "Checking "},
                          {"type": "text", "text": "now."},
                          {"type": "tool_use", "id": "toolu_1", "name": "weather",
                           "input": {"city": "Oslo"}}],
              "stop_reason": "tool_use",
              "usage": {"input_tokens": 100, "output_tokens": 20,
                        "cache_read_input_tokens": 50, "cache_creation_input_tokens": 5}}
    out = response(answer, "agent-group", lambda: 1_767_225_600.7)
    assert out["object"] == "chat.completion" and out["model"] == "agent-group"
    assert out["created"] == 1_767_225_600
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking now."
    assert choice["message"]["tool_calls"] == [{"id": "toolu_1", "type": "function", "function": {
        "name": "weather", "arguments": '{"city": "Oslo"}'}}]
    assert out["usage"] == {"prompt_tokens": 155, "completion_tokens": 20, "total_tokens": 175,
                            "prompt_tokens_details": {"cached_tokens": 50,
                                                      "cache_write_tokens": 5}}


@pytest.mark.parametrize(("reason", "finish"), [("end_turn", "stop"), ("max_tokens", "length"),
                                                ("stop_sequence", "stop"),
                                                ("refusal", "content_filter")])
def test_stop_reasons(reason: str, finish: str) -> None:
    answer = {"id": "m", "content": [{"type": "text", "text": "x"}], "stop_reason": reason}
    assert response(answer, "g", lambda: 0.0)["choices"][0]["finish_reason"] == finish


def test_an_unreadable_answer_is_said_so() -> None:
    with pytest.raises(UnreadableAnswer):
        response({"id": "m", "content": "not blocks"}, "g", lambda: 0.0)
