"""A shadow policy through real Envoy (issue #31): a weighted group whose shadow sends most
traffic to the cheap target. Every live request is served by the live policy (the
providers' counts follow its weights), the shadow's agreement and differences appear in
`/metrics`, and after the stop the decisions report holds the shadow's rollups."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "shadow-caller-token"
KEYS = {"dear": "key-dear", "cheap": "key-cheap"}
CONFIG = """\
providers:
  dear: {{base_url: '{dear}', credential: {{env: KEY_DEAR}}}}
  cheap: {{base_url: '{cheap}', credential: {{env: KEY_CHEAP}}}}
callers: [{{name: team, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 20, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  agent:
    strategy: weighted
    targets:
      - {{provider: dear, model_ref: d, weight: 3,
         pricing: {{input_per_mtok: 10, output_per_mtok: 40}}}}
      - {{provider: cheap, model_ref: c, weight: 1,
         pricing: {{input_per_mtok: 1, output_per_mtok: 4}}}}
    shadow:
      weights: {{dear/d: 1, cheap/c: 3}}
"""
REQUESTS = 40


def metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines()
                if line.startswith(f'{name}{{group="agent"}}'))
    return float(line.rsplit(" ", 1)[1])


def test_a_shadow_decides_beside_the_live_policy_and_never_acts(tmp_path: Path) -> None:
    db = tmp_path / "telemetry.db"
    fakes = [FakeProvider("dear", api_key=KEYS["dear"]),
             FakeProvider("cheap", api_key=KEYS["cheap"], behaviour=Behaviour(latency_s=0.03))]
    with keyed_stack(tmp_path, fakes, lambda providers: CONFIG.format(
            dear=providers.base_url("dear"), cheap=providers.base_url("cheap"), db=db,
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS) as (up, providers):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        served = [client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": f"question {n}"}]).model
            for n in range(REQUESTS)]
        assert served.count("d") == 30 and served.count("c") == 10  # the live weights
        assert [len(providers.provider(name).received) for name in ("dear", "cheap")] == [
            30, 10]
        deadline = time.monotonic() + 10
        while True:
            text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text
            if metric(text, "sidecar_shadow_decisions_total") >= REQUESTS:
                break
            assert time.monotonic() < deadline, "the shadow decisions never came"
            time.sleep(0.05)
        assert metric(text, "sidecar_shadow_decisions_total") == REQUESTS
        agreement = metric(text, "sidecar_shadow_agreement_rate")
        assert 0.2 <= agreement <= 0.6
        assert metric(text, "sidecar_shadow_mean_cost_delta_usd") < 0  # the shadow is cheaper
        assert metric(text, "sidecar_shadow_dropped_total") == 0
    # Stopped: its last rollup was written before telemetry stopped.
    done = subprocess.run([sys.executable, "-m", "sidecar", "report", "decisions", "--db",
                           str(db), "--by", "group", "--format", "json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [shadow] = json.loads(done.stdout)["shadow"]
    assert shadow["group"] == "agent" and shadow["decisions"] == REQUESTS
    assert shadow["agreement_rate"] == pytest.approx(agreement)
    assert shadow["policy_version"] != shadow["shadow_version"]
