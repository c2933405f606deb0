"""Reading a mirrored request's answer (rollout/mirror_answer.py): the same figures from a
JSON reply and its stream in either dialect, whatever the whitespace, key order or
framing, and nothing but figures from garbage."""

from __future__ import annotations

import json

import pytest

from sidecar.dialects.apis import Dialect
from sidecar.rollout.mirror_answer import UNDECLARED, declared_tools, read_answer

CHAT = {"id": "c1", "object": "chat.completion", "choices": [{
    "index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"city\": \"Oslo\"}"}}]}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}


def chat_stream() -> bytes:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "t1", "type": "function",
             "function": {"name": "lookup", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"city\""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ": \"Oslo\"}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7}},
    ]
    # Spaced JSON, reordered keys, CRLF line ends: provider bytes are arbitrary.
    return b"".join(b"data: " + json.dumps(dict(reversed(list(c.items())))).encode() + b"\r\n\r\n"
                    for c in chunks) + b"data: [DONE]\r\n\r\n"


MESSAGE = {"type": "message", "role": "assistant", "stop_reason": "tool_use",
           "content": [{"type": "tool_use", "id": "u1", "name": "lookup",
                        "input": {"city": "Oslo"}}],
           "usage": {"input_tokens": 12, "output_tokens": 7}}


def messages_stream() -> bytes:
    events = [
        ("message_start", {"type": "message_start", "message": {
            "type": "message", "content": [], "usage": {"input_tokens": 12,
                                                        "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "tool_use", "name": "lookup",
                                                   "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": "{\"city\": "}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta", "partial_json": "\"Oslo\"}"}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                           "usage": {"output_tokens": 7}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                    for name, data in events)


@pytest.mark.parametrize(("body", "stream", "dialect"), [
    (json.dumps(CHAT, indent=2).encode(), False, Dialect.OPENAI_CHAT),
    (chat_stream(), True, Dialect.OPENAI_CHAT),
    (json.dumps(MESSAGE).encode(), False, Dialect.ANTHROPIC_MESSAGES),
    (messages_stream(), True, Dialect.ANTHROPIC_MESSAGES),
])
def test_the_same_figures_from_either_dialect_json_or_stream(body, stream, dialect) -> None:
    answer = read_answer(body, stream, dialect, wants_json=False,
                         declared=frozenset({"lookup"}))
    assert (answer.input_tokens, answer.output_tokens) == (12, 7)
    assert answer.finish == "tool"
    assert answer.tool_names == ["lookup"] and answer.tool_arguments_valid is True
    assert answer.json_valid is None
    # A name the request did not declare is the candidate's own text: not kept.
    assert read_answer(body, stream, dialect, False).tool_names == [UNDECLARED]


def test_structured_output_and_broken_tool_arguments() -> None:
    good = {"choices": [{"finish_reason": "stop", "message": {"content": "{\"a\": [1, 2]}"}}]}
    assert read_answer(json.dumps(good).encode(), False, Dialect.OPENAI_CHAT,
                       wants_json=True).json_valid is True
    cut = {"choices": [{"finish_reason": "length", "message": {"content": "{\"a\": [1,",
        "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\":"}}]}}]}
    answer = read_answer(json.dumps(cut).encode(), False, Dialect.OPENAI_CHAT, wants_json=True)
    assert answer.finish == "length" and answer.json_valid is False
    assert answer.tool_arguments_valid is False


@pytest.mark.parametrize("body", [b"", b"<html>bad gateway</html>", b"data: {oops\n\n",
                                  b"[" * 100_000, json.dumps({"choices": "x"}).encode(),
                                  json.dumps({"usage": {"prompt_tokens": -3}}).encode()])
def test_garbage_gives_no_figures_and_no_exception(body) -> None:
    for stream in (False, True):
        for dialect in (Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES):
            answer = read_answer(body, stream, dialect, wants_json=True)
            assert answer.input_tokens is None and answer.finish is None
            assert answer.json_valid is False


def test_declared_tools_of_either_dialect() -> None:
    assert declared_tools({"tools": [{"type": "function", "function": {"name": "a"}},
                                     {"name": "b", "input_schema": {}}, "junk",
                                     {"function": {"name": "x" * 65}}]}) == {"a", "b"}
    assert declared_tools({"tools": "nope"}) == frozenset()
