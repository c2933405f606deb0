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


# --- provider behaviours (provider_behaviours.py) --------------------------------------------

def events_of(text: str) -> list[str]:
    return [event for event in text.split("\n\n") if event]


def test_every_named_behaviour_names_its_document_and_makes_a_fresh_behaviour() -> None:
    from sidecar.devstack.provider_behaviours import BEHAVIOURS, behaviour
    assert len(BEHAVIOURS) >= 15
    for name, entry in BEHAVIOURS.items():
        assert entry.follows and entry.name == name
        assert behaviour(name) is not behaviour(name)
    with pytest.raises(KeyError, match=r"known: .*chunked_json"):
        behaviour("no-such-behaviour")


def test_rate_limit_headers_come_with_the_429_in_each_providers_form(farm: ProviderThread) -> None:
    from sidecar.devstack.provider_behaviours import behaviour
    provider = farm.provider("p")
    provider.behaviour = behaviour("anthropic_rate_limited")
    response = call(farm, "/messages", {"model": "m"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert response.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert response.json()["error"]["type"] == "rate_limit_error"
    provider.behaviour = behaviour("openai_rate_limited")
    response = call(farm, "/chat/completions", {"model": "m"})
    assert response.status_code == 429
    assert response.headers["x-ratelimit-reset-requests"] == "2s"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


def test_a_transient_failure_fails_only_the_first_requests(farm: ProviderThread) -> None:
    from sidecar.devstack.provider_behaviours import behaviour
    farm.provider("p").behaviour = behaviour("transient_500")
    statuses = [call(farm, "/chat/completions", {"model": "m"}).status_code for _ in range(3)]
    assert statuses == [500, 200, 200]


def test_chunked_framing_applies_to_errors_and_completions(farm: ProviderThread) -> None:
    farm.provider("p").behaviour = Behaviour(chunked_json=True)
    response = call(farm, "/chat/completions", {"model": "m"})
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert response.json()["usage"]["completion_tokens"] > 0
    farm.provider("p").behaviour = Behaviour(chunked_json=True, status=503)
    response = call(farm, "/chat/completions", {"model": "m"})
    assert response.status_code == 503 and "content-length" not in response.headers


@pytest.mark.parametrize(("name", "path", "first"), [
    ("anthropic_overloaded_in_stream", "/messages",
     'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"'),
    ("openai_error_in_stream", "/chat/completions", 'data: {"error":{"message":'),
])
def test_an_in_band_error_is_the_whole_stream_after_a_200(farm: ProviderThread, name: str,
                                                          path: str, first: str) -> None:
    from sidecar.devstack.provider_behaviours import behaviour
    farm.provider("p").behaviour = behaviour(name)
    response = call(farm, path, {"model": "m", "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    events = events_of(response.text)
    assert len(events) == 1 and events[0].startswith(first)


def test_a_slow_first_token_sends_the_headers_at_once(farm: ProviderThread) -> None:
    farm.provider("p").behaviour = Behaviour(first_event_delay_s=0.4)
    started = time.monotonic()
    with httpx.stream("POST", farm.base_url("p") + "/chat/completions", timeout=10,
                      json={"model": "m", "stream": True},
                      headers={"authorization": "Bearer k"}) as response:
        headers_at = time.monotonic() - started
        first = next(response.iter_raw())
        first_at = time.monotonic() - started
    assert headers_at < 0.3 <= 0.4 <= first_at + 0.05
    assert first.startswith(b"data: ")


def test_a_stalled_stream_keeps_its_connection_open_and_sends_nothing_more(
        farm: ProviderThread) -> None:
    farm.provider("p").behaviour = Behaviour(stall_after_events=2)
    with httpx.stream("POST", farm.base_url("p") + "/chat/completions",
                      timeout=httpx.Timeout(10, read=0.5), json={"model": "m", "stream": True},
                      headers={"authorization": "Bearer k"}) as response:
        received = b""
        with pytest.raises(httpx.ReadTimeout):
            for piece in response.iter_raw():
                received += piece
    assert len(events_of(received.decode())) == 2


def test_a_garbage_event_sits_among_valid_ones(farm: ProviderThread) -> None:
    farm.provider("p").behaviour = Behaviour(garbage_after_events=2)
    events = events_of(call(farm, "/messages", {"model": "m", "stream": True}).text)
    assert events[2] == "data: {not json at all"
    assert events[-1].startswith("event: message_stop")


@pytest.mark.parametrize(("name", "path", "check"), [
    ("openai_context_length", "/chat/completions",
     lambda body: body["error"]["code"] == "context_length_exceeded"),
    ("anthropic_context_length", "/messages",
     lambda body: body["error"]["message"].startswith("prompt is too long: ")),
    ("vllm_context_length", "/chat/completions",
     lambda body: body["object"] == "error" and "maximum context length" in body["message"]),
])
def test_a_context_window_refuses_what_does_not_fit_in_the_providers_shape(
        farm: ProviderThread, name: str, path: str, check) -> None:
    from sidecar.devstack.provider_behaviours import behaviour
    farm.provider("p").behaviour = behaviour(name)
    assert call(farm, path, {"model": "m", "max_tokens": 8}).status_code == 200
    response = call(farm, path, {"model": "m", "max_tokens": 8, "x": "y" * 400})
    assert response.status_code == 400 and check(response.json())


def test_prompt_cache_usage_follows_each_dialects_token_semantics(farm: ProviderThread) -> None:
    """OpenAI counts cached tokens inside prompt_tokens; Anthropic reports cache reads and
    writes beside input_tokens."""
    farm.provider("p").behaviour = Behaviour(cache_tokens=(1024, 256))
    openai_usage = call(farm, "/chat/completions", {"model": "m"}).json()["usage"]
    assert openai_usage["prompt_tokens"] >= 1280
    assert openai_usage["prompt_tokens_details"] == {"cached_tokens": 1024}
    anthropic_usage = call(farm, "/messages", {"model": "m"}).json()["usage"]
    assert anthropic_usage["cache_read_input_tokens"] == 1024
    assert anthropic_usage["cache_creation_input_tokens"] == 256
    assert (anthropic_usage["input_tokens"] + 1024 + 256 == openai_usage["prompt_tokens"])
    text = call(farm, "/messages", {"model": "m", "stream": True}).text
    start = events_of(text)[0]
    assert '"cache_read_input_tokens":1024' in start


def test_injected_failures_carry_their_own_headers_and_latency(farm: ProviderThread) -> None:
    # A provider's 429 names its wait and comes at once; its successes carry no
    # retry-after (issue 41: the routing benchmark's fakes fail as the simulator does).
    provider = farm.provider("p")
    provider.behaviour = Behaviour(latency_s=5.0, error_rate=1.0, error_status=429,
                                   error_headers=(("retry-after", "2"),),
                                   error_latency_s=0.0)
    began = time.monotonic()
    failed = call(farm, "/chat/completions", {"model": "m"})
    assert time.monotonic() - began < 2.5  # not the 5 s a reply would take
    assert failed.status_code == 429 and failed.headers["retry-after"] == "2"
    assert failed.json()["error"]["type"]
    provider.behaviour = Behaviour(error_headers=(("retry-after", "2"),))
    answered = call(farm, "/chat/completions", {"model": "m"})
    assert answered.status_code == 200 and "retry-after" not in answered.headers
