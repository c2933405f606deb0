"""Anthropic Messages → OpenAI Chat: realistic requests and answers (docs/dialects.md §3, §4),
and errors both ways (§5)."""

from __future__ import annotations

import json

import pytest

from sidecar.bridge import UnreadableAnswer, Untranslatable
from sidecar.bridge.errors import CREDENTIALS_REJECTED, translated_error
from sidecar.bridge.messages_to_chat import request, response
from sidecar.bridge.registry import bridged_pairs, translator_for
from sidecar.dialects.apis import Dialect

CLAUDE_AGENT = {
    "model": "agent-group",
    "max_tokens": 512,
    "system": [{"type": "text", "text": "You are terse.",
                "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "Weather in Oslo? See the map."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/m.png"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call the tool", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 °C"},
            {"type": "text", "text": "And tomorrow?"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_2", "name": "forecast", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "service down"}]}]},
    ],
    "tools": [{"name": "weather", "description": "Now",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
              {"name": "forecast", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "thinking": {"type": "enabled", "budget_tokens": 5000},
    "metadata": {"user_id": "u-7"},
    "stream": True,
}


def test_a_multi_turn_tool_conversation_with_images_is_translated() -> None:
    out = request(CLAUDE_AGENT)
    assert out["stream"] is False and out["max_tokens"] == 512 and out["user"] == "u-7"
    assert out["stop"] == ["END"] and out["temperature"] == 0.5
    assert out["reasoning_effort"] == "medium"
    assert out["tool_choice"] == "required" and out["parallel_tool_calls"] is False
    assert out["tools"][0] == {"type": "function", "function": {
        "name": "weather", "description": "Now",
        "parameters": CLAUDE_AGENT["tools"][0]["input_schema"]}}
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    system, user, assistant, tool, user2, assistant2, failed = out["messages"]
    assert system == {"role": "system", "content": "You are terse."}
    assert user["content"][1] == {"type": "image_url",
                                  "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert user["content"][2]["image_url"]["url"] == "https://example.com/m.png"
    assert assistant == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "toolu_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "3 °C"}
    assert user2 == {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}
    assert assistant2["content"] is None and assistant2["tool_calls"][0]["id"] == "toolu_2"
    assert failed == {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: service down"}


@pytest.mark.parametrize(("change", "field"), [
    ({"top_k": 5}, "top_k"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image"}]}]}]},
     "messages[0].content[0].content[0]"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"container": "c"}, "container"),
])
def test_what_chat_cannot_express_is_named_not_dropped(change: dict, field: str) -> None:
    body = {"model": "g", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(Untranslatable) as raised:
        request(body | change)
    assert raised.value.field == field


def test_an_answer_with_text_and_tool_calls() -> None:
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-x",
              "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                  "role": "assistant", "content": "Looking it up.",
                  "tool_calls": [{"id": "call_9", "type": "function", "function": {
                      "name": "weather", "arguments": '{"city": "Oslo"}'}}]}}],
              "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
                        "prompt_tokens_details": {"cached_tokens": 100}}}
    out = response(answer, "agent-group")
    assert out["type"] == "message" and out["model"] == "agent-group"
    assert out["content"] == [
        {"type": "text", "text": "Looking it up."},
        {"type": "tool_use", "id": "call_9", "name": "weather", "input": {"city": "Oslo"}}]
    assert out["stop_reason"] == "tool_use" and out["stop_sequence"] is None
    assert out["usage"] == {"input_tokens": 20, "cache_read_input_tokens": 100,
                            "output_tokens": 30}


@pytest.mark.parametrize("answer", [
    {"choices": []},
    {"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}}]},
    {"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "1"}}]}}]},
])
def test_unreadable_answers_are_said_so(answer: dict) -> None:
    with pytest.raises(UnreadableAnswer):
        response(answer, "g")


def test_the_two_directions_round_trip_a_tool_conversation() -> None:
    """Chat → Messages → Chat keeps roles, text, calls and results (names and storage
    metadata aside)."""
    from sidecar.bridge import chat_to_messages

    chat = {"model": "g", "max_tokens": 100, "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]}
    back = request(chat_to_messages.request(chat) | {"stream": False})
    assert back["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]


@pytest.mark.parametrize(("caller", "status", "expected"), [
    (Dialect.OPENAI_CHAT, 529, 503), (Dialect.ANTHROPIC_MESSAGES, 529, 529),
    (Dialect.OPENAI_CHAT, 429, 429), (Dialect.ANTHROPIC_MESSAGES, 400, 400)])
def test_errors_keep_their_status_and_take_the_callers_shape(caller, status, expected) -> None:
    upstream = json.dumps({"type": "error", "error": {"type": "x", "message": "slow down"}})
    got, body = translated_error(status, upstream.encode(), caller)
    assert got == expected
    document = json.loads(body)
    if caller.is_anthropic:
        assert document["type"] == "error" and document["error"]["message"] == "slow down"
    else:
        assert document["error"]["message"] == "slow down"


def test_credential_errors_never_pass_the_providers_words() -> None:
    upstream = b'{"error": {"message": "Incorrect API key provided: sk-abc***xyz"}}'
    for status in (401, 403):
        _, body = translated_error(status, upstream, Dialect.ANTHROPIC_MESSAGES)
        assert b"sk-abc" not in body and CREDENTIALS_REJECTED.encode() in body
    _, body = translated_error(500, b"<html>oops</html>", Dialect.OPENAI_CHAT)
    assert b"status 500" in body


def test_the_registry_knows_its_pairs() -> None:
    assert bridged_pairs() == {(Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES),
                               (Dialect.ANTHROPIC_MESSAGES, Dialect.OPENAI_CHAT),
                               (Dialect.OPENAI_RESPONSES, Dialect.OPENAI_CHAT),
                               (Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC_MESSAGES)}
    assert translator_for(Dialect.OPENAI_CHAT, Dialect.OPENAI_CHAT) is None
    bridge = translator_for(Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES)
    assert bridge is not None
    assert bridge.request({"model": "g", "messages": [{"role": "user", "content": "x"}]})[
        "max_tokens"] == 4096
    assert bridge.response({"id": "m", "content": []}, "g", lambda: 5.0)["created"] == 5


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_structured_output_crosses_where_both_sides_can_express_it() -> None:
    from sidecar.bridge import chat_to_messages

    chat = {"model": "g", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "city", "schema": SCHEMA}}}
    assert chat_to_messages.request(chat)["output_config"] == {
        "format": {"type": "json_schema", "schema": SCHEMA}}
    assert "output_config" not in chat_to_messages.request(
        chat | {"response_format": {"type": "text"}})
    with pytest.raises(Untranslatable, match="JSON mode"):
        chat_to_messages.request(chat | {"response_format": {"type": "json_object"}})
    claude = {"model": "g", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
              "output_config": {"format": {"type": "json_schema", "schema": SCHEMA},
                                "effort": "high"}}
    out = request(claude)
    assert out["response_format"] == {"type": "json_schema",
                                      "json_schema": {"name": "output", "schema": SCHEMA}}
    assert out["reasoning_effort"] == "high"
    beta = request({**claude, "output_config": None,
                    "output_format": {"type": "json_schema", "schema": SCHEMA}})
    assert beta["response_format"]["json_schema"]["schema"] == SCHEMA
    for bad, field in (({"effort": "max"}, "output_config.effort"),
                       ({"format": {"type": "json_schema"}}, "output_config.format"),
                       ({"task_budget": 5}, "output_config.task_budget")):
        with pytest.raises(Untranslatable) as raised:
            request({**claude, "output_config": bad})
        assert raised.value.field == field
