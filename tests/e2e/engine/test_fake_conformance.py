"""Where a fake provider (sidecar/devstack/provider_wire.py) claims to send what an
OpenAI-compatible engine sends, the same request goes to both, straight (no gateway), and
the wires are compared by structure: the sequence of event kinds and the keys the gateway
reads, never the text. A fake that drifts from the real engine fails here, not in
production."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import FakeProvider
from sidecar.observe.refusals import refusal_of
from tests.e2e.engine.conftest import ENGINE_KEYS, EngineStack, prompt

pytestmark = pytest.mark.e2e

FAKE_KEY = "fake-conformance-key"
LONG = "hello world " * 60   # over the small engine's 256 tokens and the fake's 64


@pytest.fixture(scope="module")
def fake() -> Iterator[ProviderThread]:
    with ProviderThread([
            FakeProvider("fake", api_key=FAKE_KEY),
            FakeProvider("fake-window", api_key=FAKE_KEY,
                         behaviour=behaviour("llamacpp_context_length")),
            FakeProvider("fake-timings", api_key=FAKE_KEY,
                         behaviour=behaviour("llama_cpp_timings"))]) as providers:
        yield providers


def _post(base_url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(base_url + "/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {key}"})


def _both(stack: EngineStack, fake: ProviderThread, body: dict[str, Any], *,
          engine: str = "big", imitation: str = "fake", status: int = 200
          ) -> tuple[httpx.Response, httpx.Response]:
    real = _post(stack.engines[engine].base_url, ENGINE_KEYS[engine], body)
    copy = _post(fake.base_url(imitation), FAKE_KEY, {**body, "model": "fake-model"})
    assert (real.status_code, copy.status_code) == (status, status), (real.text, copy.text)
    return real, copy


def _events(response: httpx.Response) -> list[dict[str, Any] | str]:
    assert response.headers["content-type"].startswith("text/event-stream")
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in response.text.splitlines() if line.startswith("data: ")]


def _kinds(events: list[dict[str, Any] | str]) -> list[str]:
    """Each event's kind, consecutive repeats collapsed: content, finish, usage, done."""
    kinds: list[str] = []
    for event in events:
        if event == "[DONE]":
            kind = "done"
        elif not event["choices"]:
            kind = "usage" if event.get("usage") else "empty"
        elif event["choices"][0].get("finish_reason"):
            kind = "finish"
        else:
            kind = "content"
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


# The keys the gateway reads from a chat stream chunk (sidecar/observe, dialects/bridge).
CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_framing_matches_the_engine(stack: EngineStack, fake: ProviderThread,
                                           include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "tiny", "messages": prompt(), "stream": True,
                            "max_tokens": 3}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    engine, imitation = (_events(r) for r in _both(stack, fake, body))
    expected = ["content", "finish", *(["usage"] if include_usage else []), "done"]
    assert _kinds(engine) == _kinds(imitation) == expected
    for events in (engine, imitation):
        chunks = [e for e in events if isinstance(e, dict)]
        assert all(set(c) >= CHUNK_KEYS and c["object"] == "chat.completion.chunk"
                   for c in chunks)
        assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
        finish = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
        assert finish["choices"][0]["finish_reason"] == "length"
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert len(usage) == int(include_usage)
        if include_usage:
            assert set(usage[0]) >= USAGE_KEYS and usage[0]["completion_tokens"] == 3


def test_a_unary_answer_has_the_engines_shape(stack: EngineStack, fake: ProviderThread) -> None:
    body = {"model": "tiny", "messages": prompt(), "max_tokens": 3}
    engine, imitation = (r.json() for r in _both(stack, fake, body))
    for reply in (engine, imitation):
        assert {"id", "object", "created", "model", "choices", "usage"} <= set(reply)
        assert reply["object"] == "chat.completion"
        (choice,) = reply["choices"]
        assert {"index", "message", "finish_reason"} <= set(choice)
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] == "length"
        assert set(reply["usage"]) >= USAGE_KEYS and reply["usage"]["completion_tokens"] == 3


def test_a_context_refusal_is_the_engines(stack: EngineStack, fake: ProviderThread) -> None:
    """The fake's `llamacpp_context_length` (the catalogue's llama.cpp entry) against the
    small engine's own refusal of a prompt over its context: same status, same error type
    and code, and the catalogue reads both as the same entry (fall back to the next
    target). The engine sends more keys (`n_prompt_tokens`, `n_ctx`); the gateway reads
    none of them."""
    body = {"model": "tiny", "messages": prompt(LONG), "max_tokens": 4}
    engine, imitation = _both(stack, fake, body, engine="small", imitation="fake-window",
                              status=400)
    real, copy = engine.json()["error"], imitation.json()["error"]
    assert set(copy) <= set(real)
    assert (real["type"], real["code"]) == (copy["type"], copy["code"])
    assert "exceeds the available context size" in real["message"]
    entries = [refusal_of(400, r.content) for r in (engine, imitation)]
    assert entries[0] is not None and entries[0] is entries[1], entries


@pytest.mark.parametrize("include_usage", [False, True])
def test_timings_ride_on_the_last_chunk_as_the_engines_do(
        stack: EngineStack, fake: ProviderThread, include_usage: bool) -> None:
    """llama.cpp puts its `timings` object on a stream's last chunk: the finish chunk, or
    the usage chunk when usage is asked (what the gateway's unasked-usage filter moves onto
    the finish chunk it holds). The fake `llama_cpp_timings` must do the same, with keys the
    engine sends."""
    body: dict[str, Any] = {"model": "tiny", "messages": prompt(), "stream": True,
                            "max_tokens": 3}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    engine, imitation = (_events(r) for r in _both(stack, fake, body,
                                                    imitation="fake-timings"))
    for events in (engine, imitation):
        chunks = [e for e in events if isinstance(e, dict)]
        assert [i for i, c in enumerate(chunks) if "timings" in c] == [len(chunks) - 1]
        assert bool(chunks[-1].get("usage")) == include_usage
    real = next(c for c in engine if isinstance(c, dict) and "timings" in c)["timings"]
    copy = next(c for c in imitation if isinstance(c, dict) and "timings" in c)["timings"]
    assert set(copy) <= set(real), set(copy) - set(real)
    assert real["predicted_n"] == copy["predicted_n"] == 3
