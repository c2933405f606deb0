"""A provider's short answer is an answer (issue 40): a reply cut by the output limit
crosses every bridge as the caller's own max-tokens stop with what can be carried, a tool
call cut mid-arguments included (docs/dialects.md §4), and never raises (a raise is the
caller's 502, a retry and an error counted against a healthy target)."""

from __future__ import annotations

import json

import pytest

from sidecar.bridge import (
    UnreadableAnswer,
    chat_to_messages,
    chat_to_responses,
    messages_to_chat,
    responses_to_chat,
)
from sidecar.bridge.cut_arguments import complete_members, cut_tool_input
from sidecar.bridge.streams import messages_sse, responses_sse


def _chat_cut(arguments: str, content: str | None = None) -> dict:
    """A Chat answer as llama-server gave it under `max_tokens: 40` with a forced tool."""
    return {"id": "chatcmpl-7", "object": "chat.completion", "model": "engine",
            "choices": [{"index": 0, "finish_reason": "length", "message": {
                "role": "assistant", "content": content,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "weather", "arguments": arguments}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 40, "total_tokens": 90}}


@pytest.mark.parametrize(("arguments", "carried"), [
    ('{"city": "Oslo", "days": 3}', {"city": "Oslo", "days": 3}),   # whole, yet cut after
    ('{"city": "Os', {}),
    ('{"city": "Oslo", "units": "met', {"city": "Oslo"}),
    ('{"city": "Oslo", "days": 12', {"city": "Oslo"}),  # 12 may be the start of 120
    ('{"city": "Oslo", "days": 12,', {"city": "Oslo", "days": 12}),
    ('{"where": {"city": "Oslo"}, "when": [1, 2', {"where": {"city": "Oslo"}}),
    ('{"a" : "x" , "b"', {"a": "x"}),
    ("", {}), ("[1, 2", {}), ("null", {}), ("  ", {}),
])
def test_a_cut_tool_call_becomes_a_tool_use_with_what_was_complete(arguments: str,
                                                                   carried: dict) -> None:
    out = messages_to_chat.response(_chat_cut(arguments, "Let me check."), "group")
    assert out["stop_reason"] == "max_tokens"
    assert out["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": carried}]
    assert out["usage"]["output_tokens"] == 40


def test_the_synthesized_stream_of_a_cut_tool_call_ends_with_max_tokens() -> None:
    events = [json.loads(line[6:]) for line in messages_sse(messages_to_chat.response(
        _chat_cut('{"city": "Oslo", "units'), "group")).decode().splitlines()
        if line.startswith("data: ")]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    partial = [e["delta"]["partial_json"] for e in events
               if e["type"] == "content_block_delta"]
    assert [json.loads(p) for p in partial] == [{"city": "Oslo"}]


@pytest.mark.parametrize("finish", ["tool_calls", "stop", None])
def test_a_finished_answer_with_broken_arguments_is_still_unreadable(finish) -> None:
    answer = _chat_cut('{"city": "Os')
    answer["choices"][0]["finish_reason"] = finish
    with pytest.raises(UnreadableAnswer):
        messages_to_chat.response(answer, "group")


def test_a_cut_chat_answer_reaches_a_responses_caller_incomplete() -> None:
    out = responses_to_chat.response(_chat_cut('{"city": "Os', "Checking."), "g", lambda: 0.0)
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    message, call = out["output"]
    assert message["status"] == "completed"  # the text before the call was whole
    assert call["arguments"] == '{"city": "Os' and call["status"] == "incomplete"
    events = [json.loads(line[6:]) for line in responses_sse(out).decode().splitlines()
              if line.startswith("data: ")]
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["usage"]["output_tokens"] == 40


def test_a_cut_text_answer_reaches_a_responses_caller_incomplete() -> None:
    answer = _chat_cut("")
    answer["choices"][0]["message"] = {"role": "assistant", "content": "Oslo is"}
    out = responses_to_chat.response(answer, "g", lambda: 0.0)
    assert out["status"] == "incomplete" and out["output"][0]["status"] == "incomplete"


def test_a_cut_responses_answer_with_a_call_reaches_a_chat_caller_as_length() -> None:
    answer = {"id": "resp_1", "object": "response", "status": "incomplete",
              "incomplete_details": {"reason": "max_output_tokens"},
              "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_1",
                          "name": "weather", "arguments": '{"city": "Os',
                          "status": "incomplete"}],
              "usage": {"input_tokens": 50, "output_tokens": 40}}
    out = chat_to_responses.response(answer, "g", lambda: 0.0)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Os'
    assert out["usage"]["completion_tokens"] == 40


def test_a_cut_messages_answer_with_a_tool_use_reaches_a_chat_caller_as_length() -> None:
    answer = {"id": "msg_1", "type": "message", "stop_reason": "max_tokens",
              "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather",
                           "input": {"city": "Oslo"}}],
              "usage": {"input_tokens": 50, "output_tokens": 40}}
    out = chat_to_messages.response(answer, "g", lambda: 0.0)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Oslo"}


def test_the_member_reader_never_raises_on_any_prefix() -> None:
    whole = '{"a": "x\\"y", "b": [1, {"c": null}], "d": -1.5e3, "e": true, "f": {}}'
    for end in range(len(whole) + 1):
        members = complete_members(whole[:end])
        assert members.items() <= json.loads(whole).items()
    assert cut_tool_input(whole) == json.loads(whole)
    assert cut_tool_input(None) == {} and cut_tool_input("[" * 100_000) == {}


def test_the_providers_own_limits_are_a_cut_too() -> None:
    """Anthropic's `model_context_window_exceeded` (the context window filled) is Chat's
    `length`; a Responses answer cut by its filter is Chat's `content_filter`."""
    full = {"id": "m", "content": [{"type": "text", "text": "x"}],
            "stop_reason": "model_context_window_exceeded"}
    assert chat_to_messages.response(full, "g", lambda: 0.0)["choices"][0][
        "finish_reason"] == "length"
    filtered = {"id": "r", "status": "incomplete", "output": [],
                "incomplete_details": {"reason": "content_filter"}}
    assert chat_to_responses.response(filtered, "g", lambda: 0.0)["choices"][0][
        "finish_reason"] == "content_filter"
