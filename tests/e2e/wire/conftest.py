"""The stack the real-provider-wire tests share (issue #27): fake providers that behave as
real ones do (sidecar/devstack/provider_behaviours.py), `sidecar up` with real Envoy in
front of them, telemetry in SQLite, and the official SDKs as clients.

Fixtures: `wire` (one stack for the package) and `fresh` (every provider healthy and
forgotten, per test)."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import Behaviour, FakeProvider
from tests.e2e.observing import Observing

TOKEN = "wire-caller-token"
# Callers with a daily token quota each (the accounting of chunked replies, of streams).
QUOTA_TOKEN = "wire-quota-caller-token"
STREAM_QUOTA_TOKEN = "wire-stream-quota-caller-token"
OPENAI_PROVIDERS = ("o1", "o2", "o3")
ANTHROPIC_PROVIDERS = ("c1", "c2")
# h2p: an OpenAI-dialect provider Envoy reaches over HTTP/2 (devstack/provider_h2.py).
KEYS = {name: f"key-{name}-secret" for name in (*OPENAI_PROVIDERS, *ANTHROPIC_PROVIDERS, "h2p")}
OPENAI_PRICE = "{input_per_mtok: 1.25, cached_input_per_mtok: 0.125, output_per_mtok: 10}"
ANTHROPIC_PRICE = ("{input_per_mtok: 3, cached_input_per_mtok: 0.3, cache_write_per_mtok: 3.75, "
                   "output_per_mtok: 15}")
GROUPS = f"""\
models:
  priced:
    targets:
      - {{provider: o1, model_ref: o1-model, pricing: {OPENAI_PRICE}}}
  priced-claude:
    targets:
      - {{provider: c1, model_ref: c1-model, pricing: {ANTHROPIC_PRICE}}}
  chain:
    strategy: failover
    targets:
      - {{provider: o1, model_ref: o1-model, pricing: {OPENAI_PRICE}}}
      - {{provider: o2, model_ref: o2-model, pricing: {OPENAI_PRICE}}}
      - {{provider: o3, model_ref: o3-model, pricing: {OPENAI_PRICE}}}
  claude-chain:
    strategy: failover
    targets:
      - {{provider: c1, model_ref: c1-model}}
      - {{provider: c2, model_ref: c2-model}}
  # The waits a 429 asks for, without the default retry of the same target (issue 40).
  rl-chain:
    strategy: failover
    fallback: {{retry_same_target: 0}}
    targets:
      - {{provider: o1, model_ref: o1-rl}}
      - {{provider: o2, model_ref: o2-rl}}
      - {{provider: o3, model_ref: o3-rl}}
  rl-claude:
    strategy: failover
    targets:
      - {{provider: c1, model_ref: c1-rl}}
      - {{provider: c2, model_ref: c2-rl}}
  windows:
    strategy: failover
    targets:
      - {{provider: o1, model_ref: o1-small}}
      - {{provider: o2, model_ref: o2-large}}
  claude-windows:
    strategy: failover
    targets:
      - {{provider: c1, model_ref: c1-small}}
      - {{provider: c2, model_ref: c2-large}}
  declared-windows:
    strategy: failover
    targets:
      - {{provider: o1, model_ref: o1-small, context_window_tokens: 64}}
      - {{provider: o2, model_ref: o2-large, context_window_tokens: 200000}}
  retry-same:
    strategy: failover
    fallback: {{retry_same_target: 1}}
    targets:
      - {{provider: o1, model_ref: o1-model}}
      - {{provider: o2, model_ref: o2-model}}
  # The documented failover options all on (issue 40, observation 8).
  failover-options:
    strategy: failover
    fallback: {{retry_same_target: 1, wait_for_retry_after_seconds: 5,
               commit_at_first_event: true, first_token_timeout_seconds: 1.0}}
    targets:
      - {{provider: o1, model_ref: o1-opts}}
      - {{provider: o2, model_ref: o2-opts}}
  retry-same-lone:
    fallback: {{retry_same_target: 1}}
    targets:
      - {{provider: o1, model_ref: o1-lone}}
  bridged-claude:
    strategy: failover
    bridges: true
    targets:
      - {{provider: c1, model_ref: c1-bridged}}
      - {{provider: c2, model_ref: c2-bridged}}
  bridged-openai:
    strategy: failover
    bridges: true
    targets:
      - {{provider: o1, model_ref: o1-bridged}}
      - {{provider: o2, model_ref: o2-bridged}}
  bridged-dead:
    bridges: true
    targets:
      - {{provider: dead, model_ref: nowhere}}
  idle-cut:
    strategy: failover
    fallback: {{stream_idle_timeout_seconds: 1.0}}
    targets:
      - {{provider: o1, model_ref: o1-model}}
      - {{provider: o2, model_ref: o2-model}}
  wait-same:
    strategy: failover
    fallback: {{retry_same_target: 1, wait_for_retry_after_seconds: 5}}
    targets:
      - {{provider: o1, model_ref: o1-wait}}
      - {{provider: o2, model_ref: o2-wait}}
  cached:
    response_cache: {{ttl_seconds: 60}}
    targets:
      - {{provider: o3, model_ref: o3-cached, pricing: {OPENAI_PRICE}}}
  h2-chain:
    strategy: failover
    targets:
      - {{provider: h2p, model_ref: h2-model}}
      - {{provider: o2, model_ref: o2-model}}
  first-event:
    strategy: failover
    fallback: {{commit_at_first_event: true, first_token_timeout_seconds: 1.0,
               retry_same_target: 0}}
    targets:
      - {{provider: o1, model_ref: o1-model}}
      - {{provider: o2, model_ref: o2-model}}
  claude-first-event:
    strategy: failover
    fallback: {{commit_at_first_event: true, first_token_timeout_seconds: 1.0,
               retry_same_target: 0}}
    targets:
      - {{provider: c1, model_ref: c1-model}}
      - {{provider: c2, model_ref: c2-model}}
  claude-at-headers:
    strategy: failover
    fallback: {{commit_at_first_event: false}}
    targets:
      - {{provider: c1, model_ref: c1-model}}
      - {{provider: c2, model_ref: c2-model}}
"""


def config_text(providers: ProviderThread, db: Path) -> str:
    lines = ["providers:", f"  dead: {{base_url: 'http://127.0.0.1:{free_port()}/v1', "
                           "credential: null, dialects: [anthropic_messages]}",
             f"  h2p: {{base_url: '{providers.base_url('h2p')}', protocol: http2, "
             "credential: {env: KEY_H2P}}"]
    for name in OPENAI_PROVIDERS + ANTHROPIC_PROVIDERS:
        dialect = "anthropic_messages" if name in ANTHROPIC_PROVIDERS else "openai_chat"
        lines.append(f"  {name}: {{base_url: '{providers.base_url(name)}', "
                     f"credential: {{env: KEY_{name.upper()}}}, dialects: [{dialect}]}}")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    quota = ", ".join(
        f"{{name: {name}, token_sha256: {hashlib.sha256(token.encode()).hexdigest()}, "
        "models: [priced], quotas: {tokens_per_day: 100}}"
        for name, token in (("quota-team", QUOTA_TOKEN), ("stream-quota-team",
                                                           STREAM_QUOTA_TOKEN)))
    lines += [f"callers: [{{name: wire-team, token_sha256: {digest}}}, {quota}]",
              "observations: {flush_interval_ms: 50, refresh_ms: 10}",
              f"telemetry: {{sqlite_path: '{db}', replica: wire}}"]
    return "\n".join(lines) + "\n" + GROUPS


class Stack(Observing):
    def __init__(self, up: UpProcess, providers: ProviderThread, db: Path) -> None:
        self.up = up
        self.providers = providers
        self.db = db
        self.openai = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN,
                                             max_retries=0)

    def behave(self, name: str, behaviour: Behaviour) -> None:
        self.providers.provider(name).behaviour = behaviour

    def received(self, name: str) -> list:
        return list(self.providers.provider(name).received)


    def row(self, request_id_or_group: str, since: float, timeout: float = 15.0) -> dict:
        """The one telemetry row of `group` that started at or after `since`."""
        deadline = time.monotonic() + timeout
        while True:
            with sqlite3.connect(self.db) as conn:
                conn.row_factory = sqlite3.Row
                found = [dict(r) for r in conn.execute(
                    "SELECT * FROM request_rows WHERE group_name = ? AND started_at >= ? "
                    "AND join_kind = 'joined'", (request_id_or_group, since))]
            if found:
                assert len(found) == 1, found
                return found[0]
            assert time.monotonic() < deadline, f"no row for {request_id_or_group}"
            time.sleep(0.05)


def reset(stack: Stack) -> Stack:
    for provider in stack.providers.server.providers.values():
        provider.behaviour = Behaviour()
        provider.received.clear()
        provider.cancelled = 0
        provider.served = 0
    return stack


_unique = itertools.count()


def prompt() -> list[dict]:
    """A distinct prompt per call: a request is told apart in the providers' records."""
    return [{"role": "user", "content": f"hello {next(_unique)}"}]


@pytest.fixture(scope="package")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("wire")
    fakes = [FakeProvider(name, api_key=KEYS[name]) for name in KEYS]
    with ProviderThread(fakes) as providers:
        db = tmp / "telemetry.db"
        (tmp / "config.yaml").write_text(config_text(providers, db))
        env = {f"KEY_{name.upper()}": key for name, key in KEYS.items()}
        up = UpProcess(["--config", str(tmp / "config.yaml")], env=env,
                       log_path=tmp / "up.log")
        with up.running():
            yield Stack(up, providers, db)
        # Envoy's Lua and ext_proc errors do not fail a request, so they are looked for here.
        log = (tmp / "up.log").read_text()
        assert "[lua]" not in log, [line for line in log.splitlines() if "[lua]" in line][:3]


@pytest.fixture
def fresh(wire: Stack) -> Iterator[Stack]:
    """The stack with every provider healthy; afterwards, every target a provider asked to
    wait (a 429's `retry-after`) admitted again, so the next test starts clean."""
    yield reset(wire)
    deadline = time.monotonic() + 10
    while any(figures.get("retry_after_s", 0) > 0
              for figures in wire.admin("/observations")["targets"].values()):
        assert time.monotonic() < deadline, "a target still waits after 10 s"
        time.sleep(0.05)
