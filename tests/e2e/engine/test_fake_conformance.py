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
from sidecar.devstack.providers import FakeProvider
from tests.e2e.engine.conftest import ENGINE_KEYS, EngineStack, prompt

pytestmark = pytest.mark.e2e

FAKE_KEY = "fake-conformance-key"


@pytest.fixture(scope="module")
def fake() -> Iterator[ProviderThread]:
    with ProviderThread([FakeProvider("fake", api_key=FAKE_KEY)]) as providers:
        yield providers


def _post(base_url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(base_url + "/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {key}"})


def _both(stack: EngineStack, fake: ProviderThread, body: dict[str, Any]
          ) -> tuple[httpx.Response, httpx.Response]:
    engine = _post(stack.engines["big"].base_url, ENGINE_KEYS["big"], body)
    imitation = _post(fake.base_url("fake"), FAKE_KEY, {**body, "model": "fake-model"})
    assert engine.status_code == imitation.status_code == 200
    return engine, imitation


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
