"""The stack the fallback and streaming end-to-end tests share: fake providers with
failure injection (own keys each), and `sidecar up` with real Envoy in front of them.
Fixtures: `stack` (one per test module) and `fresh` (providers reset per test)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import Behaviour, FakeProvider
from tests.e2e.observing import Observing

TOKEN = "fallback-caller-token"
OPENAI_PROVIDERS = ("a1", "a2", "a3", "plain", "s1", "s2")
ANTHROPIC_PROVIDERS = ("c1", "c2")
KEYS = {name: f"key-{name}-secret" for name in OPENAI_PROVIDERS + ANTHROPIC_PROVIDERS}
CONFIG = """\
observations: {flush_interval_ms: 50, refresh_ms: 10}
# Below the 8 MiB a reply may be held: the held-reply limit follows it.
limits: {max_request_body_bytes: 4194304}
# Most groups here test where a failed attempt goes *next*, so they turn off the default
# retry of the same target (retry_same_target: 0, issue 40); `defaults-chain` keeps the
# defaults (test_fallback.py, test_the_defaults_...).
models:
  chain:
    strategy: failover
    fallback: {per_try_timeout_seconds: 0.5, retry_same_target: 0}
    targets:
      - {provider: a1, model_ref: a1-model}
      - {provider: a2, model_ref: a2-model}
      - {provider: a3, model_ref: a3-model}
  defaults-chain:
    strategy: failover
    fallback: {per_try_timeout_seconds: 0.5}
    targets:
      - {provider: a1, model_ref: a1-defaults}
      - {provider: a2, model_ref: a2-defaults}
      - {provider: a3, model_ref: a3-defaults}
  two-of-three:
    strategy: failover
    fallback: {max_attempts: 2, retry_same_target: 0}
    targets:
      - {provider: a1, model_ref: a1-model}
      - {provider: a2, model_ref: a2-model}
      - {provider: a3, model_ref: a3-model}
  tool-chain:
    strategy: failover
    targets:
      - {provider: a1, model_ref: a1-tools, supports_tools: true}
      - {provider: plain, model_ref: no-tools, supports_tools: false}
      - {provider: a3, model_ref: a3-tools, supports_tools: true}
  stream-chain:
    strategy: failover
    fallback: {retry_same_target: 0}
    targets:
      - {provider: s1, model_ref: s1-model}
      - {provider: s2, model_ref: s2-model}
  stream-deadline:
    strategy: failover
    fallback: {per_try_timeout_seconds: 0.5, deadline_seconds: 1.0}
    targets:
      - {provider: s1, model_ref: s1-model}
      - {provider: s2, model_ref: s2-model}
  dead-first:
    strategy: failover
    targets:
      - {provider: dead, model_ref: nowhere}
      - {provider: a2, model_ref: a2-model}
  deadline-chain:
    strategy: failover
    fallback: {per_try_timeout_seconds: 0.5, deadline_seconds: 0.8}
    targets:
      - {provider: a1, model_ref: a1-model}
      - {provider: a2, model_ref: a2-model}
  sticky:
    strategy: dynamic_score
    fallback: {retry_same_target: 0}
    targets:
      - {provider: a1, model_ref: a1-sticky, weight: 9}
      - {provider: a2, model_ref: a2-sticky, weight: 1}
  slow-start:
    strategy: failover
    targets:
      - {provider: s1, model_ref: s1-slowstart}
      - {provider: s2, model_ref: s2-slowstart}
  slow-start-cold:
    strategy: failover
    targets:
      - {provider: s1, model_ref: s1-cold}
      - {provider: s2, model_ref: s2-cold}
  claude-chain:
    strategy: failover
    fallback: {retry_same_target: 0}
    targets:
      - {provider: c1, model_ref: c1-model}
      - {provider: c2, model_ref: c2-model}
  claude-at-headers:
    strategy: failover
    fallback: {commit_at_first_event: false}
    targets:
      - {provider: c1, model_ref: c1-model}
      - {provider: c2, model_ref: c2-model}
"""


def config_text(providers: ProviderThread, closed_port: int) -> str:
    lines = ["providers:",
             f"  dead: {{base_url: 'http://127.0.0.1:{closed_port}/v1', credential: null}}"]
    for name in OPENAI_PROVIDERS + ANTHROPIC_PROVIDERS:
        dialect = "anthropic_messages" if name in ANTHROPIC_PROVIDERS else "openai_chat"
        lines.append(f"  {name}: {{base_url: '{providers.base_url(name)}', "
                     f"credential: {{env: KEY_{name.upper()}}}, dialects: [{dialect}]}}")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    lines.append(f"callers: [{{name: team, token_sha256: {digest}}}]")
    return "\n".join(lines) + "\n" + CONFIG


class Stack(Observing):
    def __init__(self, up: UpProcess, providers: ProviderThread) -> None:
        self.up = up
        self.providers = providers
        self.openai = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN,
                                             max_retries=0)

    def received(self, name: str) -> list:
        return list(self.providers.provider(name).received)

    def sidecar_log(self) -> str:
        assert self.up.log_path is not None
        return self.up.log_path.read_text()


def start_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("fallback")
    fakes = [FakeProvider(name, api_key=KEYS[name]) for name in KEYS]
    with ProviderThread(fakes) as providers:
        (tmp / "config.yaml").write_text(config_text(providers, free_port()))
        env = {f"KEY_{name.upper()}": key for name, key in KEYS.items()}
        up = UpProcess(["--config", str(tmp / "config.yaml")], env=env,
                       log_path=tmp / "up.log")
        with up.running():
            yield Stack(up, providers)


def reset(stack: Stack) -> Stack:
    """Every provider healthy and with an empty request record."""
    for provider in stack.providers.server.providers.values():
        provider.behaviour = Behaviour()
        provider.received.clear()
        provider.cancelled = 0
    return stack


_unique = itertools.count()


def ask(stack: Stack, group: str, **extra) -> openai.types.chat.ChatCompletion:
    # A distinct prompt per call keeps observations per call easy to tell apart in logs.
    messages = [{"role": "user", "content": f"hello {next(_unique)}"}]
    return stack.openai.chat.completions.create(model=group, messages=messages, **extra)


def assert_served_by(stack: Stack, name: str, model_ref: str) -> None:
    (request,) = stack.received(name)
    assert request.json()["model"] == model_ref
    assert request.headers["authorization"] == f"Bearer {KEYS[name]}"
    other_keys = {key for provider, key in KEYS.items() if provider != name}
    assert not other_keys & {value.removeprefix("Bearer ") for value in request.headers.values()}
    assert not [header for header in request.headers if header.startswith("x-envoy-")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from start_stack(tmp_path_factory)


@pytest.fixture
def fresh(stack: Stack) -> Stack:
    return reset(stack)
