"""Stateful Chat-to-Responses sessions (docs/dialects.md §13): the store is caller-isolated,
bounded by TTL and size, and the Chat request that goes up carries only the new turns and the
previous response id."""

from __future__ import annotations

import pytest

from sidecar.bridge import Untranslatable
from sidecar.bridge.chat_to_responses import request, response, response_id
from sidecar.gateway.sessions import SessionStore, session_key, valid_session_id
from tests.clock import ManualClock


def test_keys_isolate_callers_and_groups_and_hold_no_caller_text() -> None:
    keys = {session_key("alice", "g", "s1"), session_key("bob", "g", "s1"),
            session_key("alice", "h", "s1"), session_key("alice", "g", "s2")}
    assert len(keys) == 4 and all(len(k) == 64 and "s1" not in k for k in keys)
    assert valid_session_id("abc-123") and not valid_session_id("")
    assert not valid_session_id("x" * 129) and not valid_session_id("caf\u00e9")


def test_ttl_counts_from_the_last_turn_and_size_evicts_the_least_recent() -> None:
    clock = ManualClock()
    store = SessionStore(ttl_seconds=10, max_entries=2, clock=clock)
    store.pin("a", 1)
    clock.now = 8
    store.answered("a", "resp_1")  # a turn: the TTL starts again
    clock.now = 17
    assert store.get("a").response_id == "resp_1" and store.get("a").target_index == 1
    clock.now = 28
    assert store.get("a") is None  # 10 s after its last turn
    store.pin("b", 0)
    store.pin("c", 0)
    store.pin("d", 0)
    assert store.get("b") is None and len(store) == 2
    store.answered("zzz", "resp_x")  # an unknown session is not created by an answer
    assert store.get("zzz") is None


def test_a_session_turn_sends_only_what_follows_the_last_answer() -> None:
    chat = {"model": "m", "messages": [
        {"role": "system", "content": "brief"}, {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}],
        "max_tokens": 50, "stream": True}
    first = request(chat, None)
    assert first["instructions"] == "brief" and len(first["input"]) == 3
    assert first["max_output_tokens"] == 50 and first["stream"] is False
    later = request(chat, "resp_1")
    assert later["previous_response_id"] == "resp_1"
    assert later["input"] == [{"role": "user", "content": "two"}]
    with pytest.raises(Untranslatable):
        request({**chat, "messages": chat["messages"][:3]}, "resp_1")  # nothing new


def test_a_responses_answer_becomes_a_chat_completion() -> None:
    answer = {"id": "resp_7", "object": "response", "status": "completed", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
        "usage": {"input_tokens": 5, "output_tokens": 2}}
    out = response(answer, "g", lambda: 3.0)
    assert out["choices"][0]["message"]["content"] == "Hi"
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert response_id(b'{"id": "resp_7"}') == "resp_7" and response_id(b"oops") is None
