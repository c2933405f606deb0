"""The stack of the real-engine tests (issue #40): three `llama-server` processes serving
the tiny random-weight model (sidecar/devstack/engine/), `sidecar up` with real Envoy in
front of them, telemetry in SQLite, and the official SDKs as callers.

Engines: `big` (2 slots of 2048 tokens of context), `small` (1 slot, 256 tokens: the
context-overflow test) and `solo` (1 slot of 4096: queueing beyond the slots, cancellation,
kill and restart).
Each has its own API key; the gateway swaps the caller's token for it. `big` is also a
provider of Anthropic's Messages dialect (llama-server's `/v1/messages`): `engine-messages`.

The engine is built once per machine (llama_build.py, about 3 minutes on 2 cores) on first
use; where it cannot be built (no compiler) the tests skip with a warning."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from sidecar.devstack.engine.llama_build import EngineUnavailable, ensure_llama_server
from sidecar.devstack.engine.llama_server import LlamaServer
from sidecar.devstack.engine.tiny_model import write_tiny_model
from sidecar.devstack.harness import UpProcess
from tests.e2e.observing import Observing

TOKEN = "engine-caller-token"
ENGINE_KEYS = {"big": "engine-key-big", "small": "engine-key-small", "solo": "engine-key-solo"}
# Prices per million tokens, so a row's cost can be checked against the engine's usage.
PRICE_IN, PRICE_OUT = 2.0, 8.0
PRICING = f"{{input_per_mtok: {PRICE_IN}, output_per_mtok: {PRICE_OUT}}}"
ENGINE_OPTIONS = {
    "big": {"ctx_size": 4096, "parallel": 2},
    "small": {"ctx_size": 256, "parallel": 1},
    "solo": {"ctx_size": 4096, "parallel": 1},
}
GROUPS = f"""\
models:
  engine:
    targets: [{{provider: big, model_ref: tiny, pricing: {PRICING}}}]
  engine-messages:
    targets: [{{provider: big-messages, model_ref: tiny, pricing: {PRICING}}}]
  engine-bridged:
    bridges: true
    targets: [{{provider: big, model_ref: tiny, pricing: {PRICING}}}]
  windows:
    strategy: failover
    targets:
      - {{provider: small, model_ref: tiny}}
      - {{provider: big, model_ref: tiny}}
  solo:
    targets: [{{provider: solo, model_ref: tiny}}]
  solo-then-big:
    strategy: failover
    targets:
      - {{provider: solo, model_ref: tiny}}
      - {{provider: big, model_ref: tiny}}
"""


def _skip_loudly(why: Exception) -> None:
    warnings.warn(f"real-engine tests SKIPPED: {why}", stacklevel=2)
    pytest.skip(f"llama-server cannot be built here: {why}")


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """Built on first use (one process builds, parallel ones wait on the cache's lock)."""
    try:
        engine = ensure_llama_server()
    except EngineUnavailable as exc:
        _skip_loudly(exc)
    if engine.built_now:
        print(f"\nllama-server built in {engine.build_seconds:.0f} s: {engine.binary}")
    return engine.binary


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


class EngineStack(Observing):
    def __init__(self, up: UpProcess, engines: dict[str, LlamaServer], db: Path) -> None:
        self.up = up
        self.engines = engines
        self.db = db
        self.openai = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN,
                                             max_retries=0)

    def direct(self, name: str) -> openai.OpenAI:
        """An OpenAI client straight to an engine (no gateway): the reference."""
        return openai.OpenAI(base_url=self.engines[name].base_url, api_key=ENGINE_KEYS[name],
                             max_retries=0)

    def rows(self, group: str, since: float) -> list[dict]:
        with sqlite3.connect(self.db) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(
                "SELECT * FROM request_rows WHERE group_name = ? AND started_at >= ? "
                "AND join_kind = 'joined' ORDER BY started_at", (group, since))]

    def wait_rows(self, group: str, since: float, count: int, timeout: float = 15) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.rows(group, since)
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"{len(found)} rows of {group}, not {count}"
            time.sleep(0.05)

    def row(self, group: str, since: float) -> dict:
        (found,) = self.wait_rows(group, since, 1)
        return found


def config_text(engines: dict[str, LlamaServer], db: Path) -> str:
    lines = ["providers:"]
    for name, engine in engines.items():
        lines.append(f"  {name}: {{base_url: '{engine.base_url}', "
                     f"credential: {{env: KEY_{name.upper()}}}, dialects: [openai_chat]}}")
    # llama-server's Anthropic Messages API (`/v1/messages`) on the big engine
    lines.append(f"  big-messages: {{base_url: '{engines['big'].base_url}', "
                 "credential: {env: KEY_BIG}, dialects: [anthropic_messages]}")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    lines += [f"callers: [{{name: engine-team, token_sha256: {digest}}}]",
              "observations: {flush_interval_ms: 50, refresh_ms: 10}",
              f"telemetry: {{sqlite_path: '{db}', replica: engine}}"]
    return "\n".join(lines) + "\n" + GROUPS


@pytest.fixture(scope="package")
def engine_stack(llama_server_binary: Path, tiny_model: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineStack]:
    tmp = tmp_path_factory.mktemp("engine")
    engines = {name: LlamaServer(llama_server_binary, tiny_model, tmp, alias="tiny",
                                 api_key=ENGINE_KEYS[name], **options)
               for name, options in ENGINE_OPTIONS.items()}
    try:
        for engine in engines.values():
            engine.start()
        db = tmp / "telemetry.db"
        (tmp / "config.yaml").write_text(config_text(engines, db))
        env = {f"KEY_{name.upper()}": key for name, key in ENGINE_KEYS.items()}
        up = UpProcess(["--config", str(tmp / "config.yaml")], env=env,
                       log_path=tmp / "up.log")
        with up.running():
            yield EngineStack(up, engines, db)
    finally:
        for engine in engines.values():
            engine.stop()
    log = (tmp / "up.log").read_text()
    assert "[lua]" not in log, [line for line in log.splitlines() if "[lua]" in line][:3]


@pytest.fixture
def stack(engine_stack: EngineStack) -> Iterator[EngineStack]:
    """The stack with every engine up (a test that killed one has it restarted after)."""
    yield engine_stack
    for engine in engine_stack.engines.values():
        if engine.process is None or engine.process.poll() is not None:
            engine.start()


_unique = itertools.count()


def prompt(text: str = "hello") -> list[dict]:
    """A distinct prompt per call (the engine's prompt cache does not blur the figures)."""
    return [{"role": "user", "content": f"{text} {next(_unique)}"}]
