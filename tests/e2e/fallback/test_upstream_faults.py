"""Upstream faults end correctly through real Envoy: a huge reply streams through whatever
its size, a reply that breaks before the caller saw a byte goes to the next target, a
stream is cut at its deadline, and a 200 that is not a completion counts as an error (the
shared stack: conftest.py; docs/fallback-and-streaming.md, "Broken replies")."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack import provider_wire
from sidecar.devstack.providers import Behaviour
from tests.e2e.fallback.conftest import KEYS, TOKEN, Stack, ask, assert_served_by

pytestmark = pytest.mark.e2e

HUGE = 50 * 1024 * 1024


def post(stack: Stack, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(stack.up.base_url + path, json=body, timeout=30,
                      headers={"authorization": f"Bearer {TOKEN}"})


# --- huge replies ----------------------------------------------------------------------------

@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_huge_json_reply_reaches_the_caller_whole(fresh: Stack, framing: str) -> None:
    """Envoy used to hold every JSON reply for its usage and answered a 500 for one above the
    per-request buffer limit; the provider was charged with a server error."""
    before = fresh.figures("a1/a1-model")
    fresh.providers.provider("a1").behaviour = Behaviour(body_bytes=HUGE,
                                                         chunked_json=framing == "chunked")
    response = post(fresh, {"model": "two-of-three",
                            "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text[:300]
    reply = json.loads(response.content)
    assert reply["model"] == "a1-model"
    assert len(reply["choices"][0]["message"]["content"]) > HUGE - 65536
    assert fresh.received("a2") == []
    assert fresh.new_outcomes("a1/a1-model", before, 1) == {"ok": 1}


def test_a_reply_longer_than_the_request_buffer_limit_is_not_held(fresh: Stack) -> None:
    """6 MB: within the 8 MiB hold limit, above this stack's 4 MiB request buffer limit."""
    fresh.providers.provider("a1").behaviour = Behaviour(body_bytes=6_000_000)
    response = post(fresh, {"model": "two-of-three", "messages": []})
    assert response.status_code == 200
    assert response.json()["model"] == "a1-model"


def test_a_huge_stream_reaches_the_caller_whole(fresh: Stack) -> None:
    before = fresh.figures("s1/s1-model")
    fresh.providers.provider("s1").behaviour = Behaviour(body_bytes=HUGE)
    chunks = list(fresh.openai.chat.completions.create(
        model="stream-chain", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    text = sum(len(chunk.choices[0].delta.content or "") for chunk in chunks if chunk.choices)
    assert text > HUGE - 65536
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 700
    assert fresh.received("s2") == []
    assert fresh.new_outcomes("s1/s1-model", before, 1) == {"ok": 1}


# --- replies that break ----------------------------------------------------------------------

def test_a_reply_that_breaks_before_the_caller_saw_it_falls_back(fresh: Stack) -> None:
    """Headers and half of a content-length body, then a reset: the router had committed
    to the broken attempt at its headers and answered a 502 instead of falling back."""
    before = fresh.figures("a1/a1-model")
    fresh.providers.provider("a1").behaviour = Behaviour(reset_mid_body=True)
    reply = ask(fresh, "chain")
    assert reply.model == "a2-model"
    assert reply.choices[0].message.content.startswith("Hello from a2")
    assert len(fresh.received("a1")) == 1
    assert_served_by(fresh, "a2", "a2-model")
    assert fresh.new_outcomes("a1/a1-model", before, 1) == {"decode_error": 1}


def test_an_anthropic_reply_that_breaks_falls_back_with_the_fallbacks_own_key(
        fresh: Stack) -> None:
    fresh.providers.provider("c1").behaviour = Behaviour(reset_mid_body=True)
    message = fresh.anthropic.messages.create(
        model="claude-chain", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert message.model == "c2-model"
    (request,) = fresh.received("c2")
    assert request.headers["x-api-key"] == KEYS["c2"]


def test_when_every_reply_breaks_the_caller_gets_a_json_502(fresh: Stack) -> None:
    for name in ("c1", "c2"):
        fresh.providers.provider(name).behaviour = Behaviour(reset_mid_body=True)
    with pytest.raises(anthropic.APIStatusError) as caught:
        fresh.anthropic.messages.create(model="claude-chain", max_tokens=16,
                                        messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502
    body = caught.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    # Two targets, three attempts: c1, c2, c1 (fallback_policy.attempt_order).
    assert [len(fresh.received(name)) for name in ("c1", "c2")] == [2, 1]


def test_a_chunked_reply_that_breaks_past_the_gates_hold_ends_at_once(fresh: Stack) -> None:
    """A reply of undeclared length is held only up to Envoy's per-request buffer limit
    (`limits.max_request_body_bytes`, 4 MiB in this stack; the reply gate,
    docs/reply-gate.md), then it streams: one that breaks after that (here 5 MB in) has its headers
    with the caller, so no fallback is possible. The caller learns at once (the connection
    closes) and the target is charged. (One that breaks earlier falls back:
    tests/e2e/wire/test_commit.py.)"""
    before = fresh.figures("a1/a1-model")
    fresh.providers.provider("a1").behaviour = Behaviour(invalid_chunked=True,
                                                         body_bytes=10_000_000)
    started = time.monotonic()
    with pytest.raises(openai.APIConnectionError):
        ask(fresh, "chain")
    assert time.monotonic() - started < 2.0  # Envoy's 1 s delayed close made it > 1 s longer
    assert fresh.received("a2") == []
    assert fresh.new_outcomes("a1/a1-model", before, 1) == {"decode_error": 1}


# --- deadlines -------------------------------------------------------------------------------

def test_a_stream_is_cut_at_its_deadline(fresh: Stack) -> None:
    """`deadline_seconds: 1.0`, a stream of 40 events 100 ms apart: the caller's stream ends
    at the deadline, not a second later (Envoy's delayed close kept the socket open)."""
    before = fresh.figures("s1/s1-model")
    fresh.providers.provider("s1").behaviour = Behaviour(inter_event_delay_s=0.1,
                                                         text=" ".join(["word"] * 40))
    started = time.monotonic()
    arrivals = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in fresh.openai.chat.completions.create(
                model="stream-deadline", messages=[{"role": "user", "content": "hi"}],
                stream=True):
            arrivals.append(time.monotonic() - started)
    ended = time.monotonic() - started
    # The client's clock starts before Envoy's deadline does (the decision comes first):
    # an event Envoy passed on just before its deadline may arrive a little after 1.0 s.
    assert len(arrivals) >= 5 and arrivals[-1] < 1.2, arrivals
    assert 1.0 <= ended < 1.4, ended  # within 100 ms measured; 4x margin for a busy machine
    assert fresh.received("s2") == []
    assert fresh.new_outcomes("s1/s1-model", before, 1) == {"upstream_timeout": 1}


# --- a 200 that is not a completion ----------------------------------------------------------

OPENAI_STREAM_HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":[]}\n\n'
NOT_COMPLETIONS = {
    "openai error object": ("a1", Behaviour(
        raw_body=provider_wire.openai_error(500, "overloaded"))),
    "anthropic error object": ("c1", Behaviour(
        raw_body=provider_wire.anthropic_error(529, "busy"))),
    "html": ("a1", Behaviour(raw_body=b"<html><body>502 Bad Gateway</body></html>",
                             content_type="text/html; charset=utf-8")),
    "html labelled json": ("a1", Behaviour(raw_body=b"<html>Service Unavailable</html>")),
    "json that is no completion": ("a1", Behaviour(raw_body=b'{"status": "queued"}')),
    "failed responses object": ("a1", Behaviour(raw_body=json.dumps({
        "object": "response", "status": "failed", "output": [], "usage": None,
        "error": {"code": "server_error", "message": "The model failed."}}).encode())),
    "empty body": ("a1", Behaviour(raw_body=b"")),
    "garbage sse": ("a1", Behaviour(raw_body=b"data: <html>oops</html>\n\ndata: [DONE]\n\n",
                                    content_type="text/event-stream")),
    "openai error event": ("a1", Behaviour(
        raw_body=OPENAI_STREAM_HEAD + b"data: " + provider_wire.openai_error(500, "x") + b"\n\n",
        content_type="text/event-stream")),
    "anthropic error event": ("c1", Behaviour(
        raw_body=b"event: error\ndata: " + provider_wire.anthropic_error(529, "busy") + b"\n\n",
        content_type="text/event-stream; charset=utf-8")),
}


def _answered_by(stack: Stack, provider: str) -> httpx.Response:
    if provider == "c1":
        # A group that commits at the headers: with the default first-event commit an
        # error event first is retried (tests/e2e/wire/test_commit.py).
        return post(stack, {"model": "claude-at-headers", "max_tokens": 16, "messages": []},
                    path="/v1/messages")
    return post(stack, {"model": "chain", "messages": []})


@pytest.mark.parametrize("case", NOT_COMPLETIONS)
def test_a_200_that_is_not_a_completion_counts_as_an_error(fresh: Stack, case: str) -> None:
    provider, behaviour = NOT_COMPLETIONS[case]
    target = f"{provider}/{provider}-model"
    before = fresh.figures(target)
    fresh.providers.provider(provider).behaviour = behaviour
    response = _answered_by(fresh, provider)
    assert response.status_code == 200  # passed on as the provider sent it
    assert response.content == behaviour.raw_body
    assert fresh.new_outcomes(target, before, 1) == {"invalid_response": 1}
    assert fresh.figures(target)["error_rate"] > 0


STILL_COMPLETIONS = {
    "openai stream without usage": Behaviour(
        raw_body=OPENAI_STREAM_HEAD + b"data: [DONE]\n\n", content_type="text/event-stream"),
    "responses object with error: null": Behaviour(raw_body=json.dumps({
        "object": "response", "status": "completed", "error": None, "output": [],
        "usage": {"input_tokens": 1, "output_tokens": 3, "total_tokens": 4}}).encode()),
    "chunked json (not read)": Behaviour(chunked_json=True),
    "chat completion without usage": Behaviour(raw_body=json.dumps({
        "id": "c", "object": "chat.completion", "model": "a1-model", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"},
             "finish_reason": "stop"}]}).encode()),
}


@pytest.mark.parametrize("case", STILL_COMPLETIONS)
def test_completions_are_not_mistaken_for_errors(fresh: Stack, case: str) -> None:
    before = fresh.figures("a1/a1-model")
    fresh.providers.provider("a1").behaviour = STILL_COMPLETIONS[case]
    assert _answered_by(fresh, "a1").status_code == 200
    assert fresh.new_outcomes("a1/a1-model", before, 1) == {"ok": 1}
