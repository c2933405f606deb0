"""Envoy's reader of a mirrored request's live answer (envoy_config/answer_facts.lua), run in
LuaJIT as Envoy runs it (tests/envoy_lua.py): the same finish and tool names from a JSON
answer and its stream in either dialect, whatever the whitespace, key order, escapes or
write boundaries; the answer passes unchanged; garbage and oversized answers give nothing."""

from __future__ import annotations

import json

import pytest

from sidecar.envoy_config.answer_facts import MAX_ANSWER_BYTES, answer_facts_script
from tests.envoy_lua import LuaFilter
from tests.unit.rollout.test_mirror_answer import CHAT, MESSAGE, chat_stream, messages_stream

JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream"}


@pytest.fixture(scope="module")
def lua() -> LuaFilter:
    return LuaFilter(answer_facts_script())


def cut(body: bytes, size: int) -> list[bytes]:
    return [body[i:i + size] for i in range(0, len(body), size)] or [b""]


@pytest.mark.parametrize(("body", "headers"), [
    (json.dumps(CHAT, indent=2).encode(), JSON),
    (chat_stream(), SSE),
    (json.dumps(MESSAGE).encode(), JSON),
    (messages_stream(), SSE),
    (messages_stream().replace(b"\n", b"\r"), SSE),
])
@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
def test_finish_and_tools_whatever_the_write_boundaries(lua, body, headers, size) -> None:
    response = lua.respond(cut(body, size), headers)
    assert response.body == body               # passed unchanged
    assert response.metadata["sidecar.answer/finish"] in ("tool_calls", "tool_use")
    assert response.metadata["sidecar.answer/tools"] == "lookup"


def test_text_answers_escapes_and_several_tools(lua) -> None:
    answer = {"choices": [{"finish_reason": "st\\u006fp", "message": {"tool_calls": [
        {"function": {"name": "a"}}, {"function": {"name": "b\\u0031"}}]}}]}
    text = json.dumps(answer).replace("\\\\u", "\\u").encode()
    response = lua.respond([text], JSON)
    assert response.metadata == {"sidecar.answer/finish": "stop",
                                 "sidecar.answer/tools": "a,b1"}


@pytest.mark.parametrize(("body", "headers"), [
    (b"<html>bad gateway</html>", JSON), (b"data: {oops\n\n", SSE), (b"[" * 50_000, JSON),
    (json.dumps({"choices": "x"}).encode(), JSON), (b"", JSON),
    (b'{"choices": [{"finish_reason": "stop"}], "x": "' + b"y" * MAX_ANSWER_BYTES + b'"}',
     JSON),
])
def test_garbage_or_an_oversized_answer_gives_nothing(lua, body, headers) -> None:
    response = lua.respond(cut(body, 65536), headers)
    assert response.metadata == {} and response.body == body


def test_tool_names_as_the_candidates_reader_keeps_them(lua) -> None:
    calls = [{"function": {"name": name}} for name in ("", "a", "x" * 65, "b,c")]
    text = json.dumps({"choices": [{"finish_reason": "tool_calls",
                                    "message": {"tool_calls": calls}}]}).encode()
    assert lua.respond([text], JSON).metadata["sidecar.answer/tools"] == "a,~,~"


def test_a_long_event_in_small_writes_is_read_once_and_an_endless_one_is_dropped(lua) -> None:
    event = b"data: " + json.dumps({"choices": [{"finish_reason": "stop", "delta": {
        "content": "z" * 20_000}}]}).encode() + b"\n\n"
    assert lua.respond(cut(event, 100), SSE).metadata == {"sidecar.answer/finish": "stop"}
    endless = b"data: " + b"z" * 200_000 + b"\n\n" + event
    response = lua.respond(cut(endless, 4096), SSE)
    assert response.metadata == {"sidecar.answer/finish": "stop"}
    assert response.body == endless
