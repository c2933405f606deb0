"""The demo providers speak the real wire formats and obey their knobs; tests of later
capabilities (fallback, observations) depend on these knobs doing exactly what they say."""

from __future__ import annotations

import time

import httpx
import pytest

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import Behaviour, FakeProvider


@pytest.fixture
def farm():
    with ProviderThread([FakeProvider("p", api_key="k")]) as providers:
        yield providers


def call(farm: ProviderThread, path: str, body: dict, key: str = "k", **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(farm.base_url("p") + path, json=body, headers=headers, timeout=10, **kw)


def test_openai_json_and_truncation_by_max_tokens(farm: ProviderThread) -> None:
    body = call(farm, "/chat/completions", {"model": "m", "max_completion_tokens": 2}).json()
    assert body["choices"][0]["message"]["content"] == "Hello from "
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_openai_sse_ends_with_usage_and_done(farm: ProviderThread) -> None:
    text = call(farm, "/chat/completions", {"model": "m", "stream": True,
                                            "stream_options": {"include_usage": True}}).text
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert '"usage"' in events[-2] and '"choices":[]' in events[-2]


def test_anthropic_sse_event_sequence(farm: ProviderThread) -> None:
    text = httpx.post(farm.base_url("p") + "/messages", json={"model": "m", "stream": True},
                      headers={"x-api-key": "k"}, timeout=10).text
    names = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event:")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_wrong_key_is_rejected_in_the_providers_dialect(farm: ProviderThread) -> None:
    response = call(farm, "/messages", {"model": "m"}, key="wrong")
    assert response.status_code == 401
    assert response.json()["type"] == "error"


def test_status_latency_and_reset_knobs(farm: ProviderThread) -> None:
    provider = farm.provider("p")
    provider.behaviour = Behaviour(status=529)
    response = call(farm, "/messages", {"model": "m"})
    assert response.status_code == 529
    assert response.json()["error"]["type"] == "overloaded_error"
    provider.behaviour = Behaviour(status=429)
    assert call(farm, "/chat/completions", {"model": "m"}).status_code == 429
    provider.behaviour = Behaviour(latency_s=0.3)
    started = time.monotonic()
    assert call(farm, "/chat/completions", {"model": "m"}).status_code == 200
    assert time.monotonic() - started >= 0.3
    provider.behaviour = Behaviour(reset_connection=True)
    with pytest.raises(httpx.TransportError):
        call(farm, "/chat/completions", {"model": "m"})
    assert [r.path for r in provider.received] == [
        "/p/v1/messages"] + ["/p/v1/chat/completions"] * 3  # the reset one is recorded too


def test_drift_knobs_error_rate_reply_length_and_output_rate_are_seeded(
        farm: ProviderThread) -> None:
    """The routing-quality benchmark's drifting provider: the same seed gives the same
    failures; replies are `reply_words` long and take words ÷ tokens_per_s."""
    provider = farm.provider("p")
    provider.behaviour = Behaviour(error_rate=0.5, reply_words=lambda request: 20,
                                   tokens_per_s=400.0)
    statuses = [call(farm, "/chat/completions", {"model": "m"}).status_code
                for _ in range(40)]
    assert set(statuses) == {200, 503} and 8 < statuses.count(503) < 32
    replay = FakeProvider("p", seed=0)
    assert [replay.rng.random() < 0.5 for _ in range(40)] == [s == 503 for s in statuses]
    provider.behaviour = Behaviour(reply_words=lambda request: 20, tokens_per_s=400.0)
    started = time.monotonic()
    body = call(farm, "/chat/completions", {"model": "m"}).json()
    assert body["usage"]["completion_tokens"] == 20
    assert time.monotonic() - started >= 20 / 400.0
    assert provider.received[-1].at >= started
