"""Issue #2 points 2 and 4 through the official OpenAI SDK, real Envoy and the real sidecar."""

from __future__ import annotations

import itertools
import time

import openai
import pytest

from sidecar.devstack.harness import ProviderThread
from tests.e2e.conftest import PROVIDER_KEYS, TOKEN_A, TOKEN_B, Stack

pytestmark = pytest.mark.e2e

SPEC_TARGETS = {"baseten": "gpt-oss-120b", "minimax": "m3", "openai": "gpt-5.4-nano"}


def client(stack: Stack, token: str = TOKEN_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=token, max_retries=0)


def _served_by(providers: ProviderThread, names) -> list[tuple[str, object]]:
    return [(name, request) for name in names for request in providers.provider(name).received]


def assert_clean_upstream(request, provider: str, model_ref: str) -> None:
    """What the upstream got: the target's model, the provider key, nothing of the caller."""
    assert request.json()["model"] == model_ref
    assert request.headers["authorization"] == f"Bearer {PROVIDER_KEYS[provider]}"
    assert "x-route-cluster" not in request.headers
    assert "x-forwarded-for" not in request.headers  # the caller's address stays with us
    raw = repr(request.headers) + request.body.decode()
    for token in (TOKEN_A, TOKEN_B):
        assert token not in raw


def test_models_list_shows_exactly_the_callers_groups(stack: Stack) -> None:
    ids = [model.id for model in client(stack).models.list()]
    assert ids == ["adaptive-agent", "weighted-trio", "claude-agent", "drip-group",
        "dead-group", "affinity-agent",
                   "adaptive-agent-meta"]
    assert [m.id for m in client(stack, TOKEN_B).models.list()] == [
        "private-group", "affinity-agent"]


def test_models_list_does_not_touch_providers(stack: Stack, providers: ProviderThread) -> None:
    client(stack).models.list()
    assert all(not p.received for p in providers.server.providers.values())


def test_chat_completion_reaches_a_spec_target_with_its_model_ref(
    stack: Stack, providers: ProviderThread
) -> None:
    raw = client(stack).chat.completions.with_raw_response.create(
        model="adaptive-agent", messages=[{"role": "user", "content": "Say hello"}]
    )
    # The fake provider names its account, as real ones do; callers never see it.
    assert "openai-organization" not in raw.headers
    reply = raw.parse()
    served = _served_by(providers, SPEC_TARGETS)
    assert len(served) == 1
    provider, request = served[0]
    assert_clean_upstream(request, provider, SPEC_TARGETS[provider])
    assert request.path == f"/{provider}/v1/chat/completions"
    assert request.json()["messages"] == [{"role": "user", "content": "Say hello"}]
    assert reply.model == SPEC_TARGETS[provider]
    assert reply.choices[0].message.content.startswith(f"Hello from {provider}")


def test_chat_completion_streams_incrementally(stack: Stack, providers: ProviderThread) -> None:
    started = time.monotonic()
    stream = client(stack).chat.completions.create(
        model="drip-group",
        messages=[{"role": "user", "content": "Stream please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    arrivals: list[float] = []
    text = ""
    usage = None
    for chunk in stream:
        arrivals.append(time.monotonic() - started)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert text == "Hello from drip serving drip-model. This is a demo completion."
    assert usage is not None and usage.completion_tokens == 10
    # The provider waits 0.25 s between events: 13 events span ~3 s. Delivered all at once,
    # the first and last would arrive together.
    assert arrivals[-1] - arrivals[0] > 2.0
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(gap > 0.15 for gap in gaps) >= 8
    (request,) = providers.provider("drip").received
    assert_clean_upstream(request, "drip", "drip-model")
    assert request.json()["stream"] is True


def test_caller_cannot_pick_the_cluster(stack: Stack, providers: ProviderThread) -> None:
    """A caller-sent routing header is dropped; the sidecar's choice stands."""
    client(stack).chat.completions.create(
        model="weighted-trio",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-route-cluster": "target__private-group__0__p5"},
    )
    assert not any(r.json()["model"] == "private-model" for r in providers.provider("p5").received)


def test_caller_cannot_steer_envoy_with_x_envoy_headers(
    stack: Stack, providers: ProviderThread
) -> None:
    """x-envoy-* control headers from callers are stripped, not obeyed: a 1 ms upstream
    timeout would otherwise turn this slow (0.3 s) request into a 504."""
    drip = providers.provider("drip")
    before = drip.behaviour
    drip.behaviour = type(before)(latency_s=0.3)
    try:
        reply = client(stack).chat.completions.create(
            model="drip-group", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-envoy-upstream-rq-timeout-ms": "1", "x-envoy-max-retries": "5",
                           "x-envoy-retry-on": "5xx"})
    finally:
        drip.behaviour = before
    assert reply.model == "drip-model"
    (request,) = drip.received
    sent = {"x-envoy-upstream-rq-timeout-ms", "x-envoy-max-retries", "x-envoy-retry-on"}
    assert not sent & set(request.headers)


def test_a_two_megabyte_request_is_routed_and_arrives_intact(
    stack: Stack, providers: ProviderThread
) -> None:
    """Bodies over Envoy's default 1 MiB buffer and gRPC's 4 MiB-ish defaults: the route's
    buffer limit and the sidecar's message limits follow limits.max_request_body_bytes."""
    prompt = "x" * (2 * 1024 * 1024)
    reply = client(stack).chat.completions.create(
        model="weighted-trio", messages=[{"role": "user", "content": prompt}])
    assert reply.choices[0].message.content.startswith("Hello from")
    served = [r for name in ("p60", "p25", "p5") for r in providers.provider(name).received]
    (request,) = served
    assert request.json()["messages"][0]["content"] == prompt
    assert request.json()["model"] in {"model-60", "model-25", "model-5"}


def test_responses_api_reaches_only_targets_that_speak_it(
    stack: Stack, providers: ProviderThread
) -> None:
    """In the SPEC group only the openai target speaks the Responses API natively."""
    for i in range(3):
        response = client(stack).responses.create(model="adaptive-agent",
                                                  input=f"Say hi, round {i}")
        assert response.output_text.startswith("Hello from openai serving gpt-5.4-nano")
    served = _served_by(providers, SPEC_TARGETS)
    assert [name for name, _ in served] == ["openai"] * 3
    _, request = served[0]
    assert request.path == "/openai/v1/responses"
    assert_clean_upstream(request, "openai", "gpt-5.4-nano")
