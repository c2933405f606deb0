"""Structured output as an eligibility rule through real Envoy (issue #16): requests that
ask for JSON mode or a JSON schema, from the OpenAI and the Anthropic SDK, reach only the
targets that declare `supports_structured_output`; a group with none answers a clear 400 in
the caller's dialect; plain requests still use every target."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "structured-caller-token"
CONFIG = """\
providers:
  json: {{base_url: '{json}', credential: {{env: KEY_JSON}},
          dialects: [openai_chat, anthropic_messages]}}
  plain: {{base_url: '{plain}', credential: {{env: KEY_PLAIN}},
           dialects: [openai_chat, anthropic_messages]}}
callers: [{{name: team-a, token_sha256: {digest}}}]
models:
  mixed:
    targets:
      - {{provider: json, model_ref: json-model, supports_structured_output: true}}
      - {{provider: plain, model_ref: plain-model, weight: 3}}
  plain-only:
    targets:
      - {{provider: plain, model_ref: plain-model}}
"""
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, ProviderThread]]:
    workdir: Path = tmp_path_factory.mktemp("structured")
    fakes = [FakeProvider("json", api_key="key-json"), FakeProvider("plain", api_key="key-plain")]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            json=providers.base_url("json"), plain=providers.base_url("plain"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()),
            {"json": "key-json", "plain": "key-plain"}) as running:
        yield running


def counts(providers: ProviderThread) -> dict[str, int]:
    return {name: len(providers.provider(name).received) for name in ("json", "plain")}


def test_openai_structured_requests_reach_only_the_declared_target(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    before = counts(providers)
    for response_format in ({"type": "json_object"},
                            {"type": "json_schema",
                             "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}):
        for _ in range(4):
            client.chat.completions.create(
                model="mixed", messages=[{"role": "user", "content": "a city, as JSON"}],
                response_format=response_format)
    after = counts(providers)
    assert after["json"] - before["json"] == 8 and after["plain"] == before["plain"]
    for _ in range(8):  # plain requests keep the weights (1:3)
        client.chat.completions.create(model="mixed",
                                       messages=[{"role": "user", "content": "hello"}])
    assert counts(providers)["plain"] - after["plain"] == 6


def test_anthropic_structured_requests_reach_only_the_declared_target(stack) -> None:
    up, providers = stack
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
    before = counts(providers)
    for _ in range(4):
        client.messages.create(model="mixed", max_tokens=50,
                               messages=[{"role": "user", "content": "a city, as JSON"}],
                               output_config={"format": {"type": "json_schema",
                                                         "schema": SCHEMA}})
    after = counts(providers)
    assert after["json"] - before["json"] == 4 and after["plain"] == before["plain"]


def test_a_group_without_a_capable_target_refuses_clearly(stack) -> None:
    up, providers = stack
    before = counts(providers)
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="plain-only",
                                       messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_object"})
    assert "structured output" in refused.value.message
    claude = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused_too:
        claude.messages.create(model="plain-only", max_tokens=5,
                               messages=[{"role": "user", "content": "x"}],
                               output_config={"format": {"type": "json_schema",
                                                         "schema": SCHEMA}})
    assert "structured output" in str(refused_too.value)
    assert counts(providers) == before
