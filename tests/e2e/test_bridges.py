"""Dialect bridges through real Envoy (issue #16, first slice): the official OpenAI SDK
reaches an Anthropic-only group and the Anthropic SDK an OpenAI-only group, unary and
streamed; the provider receives its own API, with its own key, and the caller gets its
own; a request a bridge cannot carry is refused by name; native traffic is unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "bridge-caller-token"
KEYS = {"claude": "key-claude", "gpt": "key-gpt"}
CONFIG = """\
providers:
  claude: {{base_url: '{claude}', credential: {{env: KEY_CLAUDE}},
            dialects: [anthropic_messages]}}
  gpt: {{base_url: '{gpt}', credential: {{env: KEY_GPT}}}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
models:
  claude-only:
    bridges: true
    targets: [{{provider: claude, model_ref: claude-model}}]
  gpt-only:
    bridges: true
    targets: [{{provider: gpt, model_ref: gpt-model}}]
  claude-native:
    targets: [{{provider: claude, model_ref: claude-model}}]
  claude-first:
    strategy: failover
    bridges: true
    targets:
      - {{provider: claude, model_ref: claude-model}}
      - {{provider: gpt, model_ref: gpt-model}}
  gpt-first:
    strategy: failover
    bridges: true
    targets:
      - {{provider: gpt, model_ref: gpt-model}}
      - {{provider: claude, model_ref: claude-model}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, ProviderThread]]:
    workdir: Path = tmp_path_factory.mktemp("bridges")
    fakes = [FakeProvider(name, api_key=key) for name, key in KEYS.items()]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            claude=providers.base_url("claude"), gpt=providers.base_url("gpt"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS) as running:
        yield running


def test_the_openai_sdk_reaches_an_anthropic_only_group(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    reply = client.chat.completions.create(
        model="claude-only", max_tokens=40,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "hello over the bridge"}])
    assert reply.object == "chat.completion" and reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens > 0
    received = providers.provider("claude").received[-1]
    assert received.path.endswith("/messages")
    upstream = received.json()
    assert upstream["model"] == "claude-model" and upstream["system"] == "be brief"
    assert upstream["max_tokens"] == 40 and upstream["stream"] is False
    assert received.headers.get("x-api-key") == KEYS["claude"]
    assert "anthropic-version" in received.headers


def test_the_openai_sdk_streams_from_an_anthropic_only_group(stack) -> None:
    up, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    chunks = list(client.chat.completions.create(
        model="claude-only", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream over the bridge"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_anthropic_sdk_reaches_an_openai_only_group(stack) -> None:
    up, providers = stack
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
    message = client.messages.create(model="gpt-only", max_tokens=30,
                                     system="be brief",
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.type == "message" and message.content[0].text
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
    received = providers.provider("gpt").received[-1]
    assert received.path.endswith("/chat/completions")
    upstream = received.json()
    assert upstream["messages"][0] == {"role": "system", "content": "be brief"}
    assert received.headers.get("authorization") == f"Bearer {KEYS['gpt']}"
    with client.messages.stream(model="gpt-only", max_tokens=30,
                                messages=[{"role": "user", "content": "stream"}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].text and final.usage.output_tokens > 0


def test_what_cannot_cross_is_refused_by_name_and_native_groups_stay_native(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    before = len(providers.provider("claude").received)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude-only", n=2,
                                       messages=[{"role": "user", "content": "x"}])
    assert "cannot be bridged" in refused.value.message and "n:" in refused.value.message
    with pytest.raises(openai.BadRequestError) as native:
        client.chat.completions.create(model="claude-native",
                                       messages=[{"role": "user", "content": "x"}])
    assert "none speaks the openai_chat API" in native.value.message
    assert len(providers.provider("claude").received) == before


@pytest.mark.parametrize(("group", "failing", "serving", "path"), [
    ("claude-first", "claude", "gpt", "/chat/completions"),   # bridged, then native
    ("gpt-first", "gpt", "claude", "/messages"),              # native, then bridged
])
def test_a_fallback_crosses_dialects_before_the_answer_starts(
        stack, group: str, failing: str, serving: str, path: str) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    providers.provider(failing).behaviour = Behaviour(status=503)
    try:
        before = len(providers.provider(serving).received)
        reply = client.chat.completions.create(
            model=group, messages=[{"role": "user", "content": "fall over"}])
    finally:
        providers.provider(failing).behaviour = Behaviour()
    assert reply.object == "chat.completion" and reply.choices[0].message.content
    received = list(providers.provider(serving).received)[before:]
    assert len(received) == 1 and received[0].path.endswith(path)
    assert received[0].json()["model"] == f"{serving}-model"
    key_header = "x-api-key" if serving == "claude" else "authorization"
    assert KEYS[serving] in received[0].headers[key_header]
    assert KEYS[failing] not in str(received[0].headers)
