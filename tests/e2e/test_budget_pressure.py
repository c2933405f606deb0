"""`budget_pressure` through real Envoy (issue #31): a caller with a daily spend budget
calls a dynamic-score group whose score term leans on price as the budget runs down. The
spend the access log reports raises the pressure, the decisions move to the cheap target,
the telemetry rows carry the pressure, and at the limit the quota refuses."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import openai
import pytest

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "budget-caller-token"
KEYS = {"dear": "key-dear", "cheap": "key-cheap"}
CONFIG = """\
providers:
  dear: {{base_url: '{dear}', credential: {{env: KEY_DEAR}}}}
  cheap: {{base_url: '{cheap}', credential: {{env: KEY_CHEAP}}}}
callers:
  - {{name: team, token_sha256: {digest}, quotas: {{spend_per_day_usd: {budget}}}}}
observations: {{flush_interval_ms: 20, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  agent:
    strategy: dynamic_score
    targets:
      - {{provider: dear, model_ref: d, weight: 70,
         pricing: {{input_per_mtok: 1000, output_per_mtok: 1000}}}}
      - {{provider: cheap, model_ref: c, weight: 30,
         pricing: {{input_per_mtok: 50, output_per_mtok: 50}}}}
    routing_policy:
      dynamic_score:
        min_observations: 3
        affinity: {{enabled: false}}
        max_score_adjustment_percent: 90
        score_terms:
          - name: fast_until_the_budget_runs_down
            expression: "0.45 * cost_score * (1 + budget_pressure)
                         + 0.55 * latency_score * (1 - budget_pressure)"
"""


def test_spending_moves_to_the_cheap_target_as_the_budget_runs_down(tmp_path: Path) -> None:
    db = tmp_path / "telemetry.db"
    fakes = [FakeProvider("dear", api_key=KEYS["dear"]),
             FakeProvider("cheap", api_key=KEYS["cheap"], behaviour=Behaviour(latency_s=0.08))]
    with keyed_stack(tmp_path, fakes, lambda providers: CONFIG.format(
            dear=providers.base_url("dear"), cheap=providers.base_url("cheap"), db=db,
            budget=0.6, digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS) as (up, _):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        served: list[str] = []
        refused = None
        for n in range(200):
            try:
                reply = client.chat.completions.create(
                    model="agent", messages=[{"role": "user", "content": f"question {n}"}])
            except openai.RateLimitError as exc:
                refused = exc
                break
            served.append(reply.model)
            time.sleep(0.06)  # the access log's spend reaches the counters in between
        assert refused is not None, "the budget never ran out"
        assert refused.body["type"] == "rate_limit_exceeded" or "spend" in str(refused)
    with sqlite3.connect(db) as conn:
        rows = [(json.loads(scores), target) for scores, target in conn.execute(
            "SELECT selected_scores, selected_target FROM request_rows "
            "WHERE strategy = 'dynamic_score' ORDER BY started_at")]
        admissions = [a for (a,) in conn.execute(
            "SELECT admission FROM request_rows WHERE admission IS NOT NULL")]
    pressures = [scores["budget_pressure"] for scores, _ in rows if "budget_pressure" in scores]
    assert pressures[0] == "0.0-0.2" and pressures[-1] in ("0.6-0.8", "0.8-1.0")
    # By the pressure each decision saw (the rows carry it), not by position: how fast the
    # budget runs down depends on the machine.
    def cheap_share(buckets: tuple[str, ...]) -> float:
        picked = [target for scores, target in rows
                  if scores.get("budget_pressure") in buckets]
        assert picked, buckets
        return sum(target == "cheap/c" for target in picked) / len(picked)
    low, high = cheap_share(("0.0-0.2",)), cheap_share(("0.6-0.8", "0.8-1.0"))
    assert high > low + 0.2, (low, high)
    assert len(served) == len(rows)
    assert admissions == ["caller_spend_per_day_usd"]
