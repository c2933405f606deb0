"""Hedged first tokens through real Envoy (issue #31, docs/hedging.md): a failover group
[slow, fast] with `hedge`. The slow primary's request keeps running while a hedge goes to
the second target at the deadline; the first to answer is served, with the second
target's model and key; the loser is cancelled and observed as `hedged_out`, not as a
failure. A primary that answers in time is served alone; one that fails goes to the second
target through the same pair; the budget stops hedging when its tokens are spent."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import httpx
import openai
import pytest

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "hedge-caller-token"
KEYS = {"slow": "key-slow", "fast": "key-fast"}
CONFIG = """\
providers:
  slow: {{base_url: '{slow}', credential: {{env: KEY_SLOW}}}}
  fast: {{base_url: '{fast}', credential: {{env: KEY_FAST}}}}
callers: [{{name: team, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 20, refresh_ms: 10}}
models:
  agent:
    strategy: failover
    targets:
      - {{provider: slow, model_ref: s}}
      - {{provider: fast, model_ref: f}}
    fallback: {{per_try_timeout_seconds: 30{gate}}}
    hedge: {{max_deadline_seconds: 0.4, burst: {burst}, budget_percent: {budget}}}
"""
SLOW_S = 3.0


def metric(text: str, name: str) -> float:
    line = next((line for line in text.splitlines()
                 if line.startswith(f'sidecar_{name}_total{{group="agent"}}')), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


def nothing_waits(text: str) -> bool:
    """Every hedged request's entries met (the loser's, the winner's request entry)."""
    return "\nsidecar_access_log_attempts_waiting 0.0" in text


def metrics_when(up, ready) -> str:
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text
        if ready(text):
            return text
        assert time.monotonic() < deadline, "the access log never settled the hedges"
        time.sleep(0.05)


def stack(tmp_path: Path, slow: Behaviour, budget: int = 100, burst: int = 20,
          gate: bool = False):
    fakes = [FakeProvider("slow", api_key=KEYS["slow"], behaviour=slow),
             FakeProvider("fast", api_key=KEYS["fast"], behaviour=Behaviour(latency_s=0.05))]
    return keyed_stack(tmp_path, fakes, lambda providers: CONFIG.format(
        slow=providers.base_url("slow"), fast=providers.base_url("fast"), burst=burst,
        budget=budget,
        gate=", commit_at_first_event: true" if gate else "",
        digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS)


def ask(client: openai.OpenAI, n: int, stream: bool = False) -> tuple[str, float]:
    started = time.monotonic()
    messages = [{"role": "user", "content": f"question {n}"}]
    if stream:
        chunks = list(client.chat.completions.create(model="agent", messages=messages,
                                                     stream=True))
        model = next(chunk.model for chunk in chunks if chunk.model)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        model = client.chat.completions.create(model="agent", messages=messages).model
    return model, time.monotonic() - started


def test_a_slow_primary_is_hedged_and_the_first_answer_wins(tmp_path: Path) -> None:
    with stack(tmp_path, Behaviour(latency_s=SLOW_S)) as (up, providers):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        for n, streamed in enumerate((False, True, False)):
            model, took = ask(client, n, streamed)
            # The fast target's answer, with its model (retargeted) and key (else a 401).
            assert model == "f"
            assert 0.35 < took < SLOW_S - 1.0, took
        slow, fast = providers.provider("slow"), providers.provider("fast")
        assert len(slow.received) == 3 and len(fast.received) == 3
        assert all(r.json()["model"] == "f" for r in fast.received)
        text = metrics_when(up, lambda t: metric(t, "hedge_second_won") >= 3)
        assert metric(text, "hedge_hedged") == 3 and metric(text, "hedge_second_attempts") == 3
        # The slow target's cancelled attempts are no failures: no error rate, and its
        # time to first byte is at least the deadline.
        seen = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/observations?format=json",
                         timeout=5).json()["targets"]["slow/s"]
        # No count or rate counts them; their time to first byte was at least the deadline.
        assert seen["count"] == 0 and seen["error_rate"] == 0.0
        assert seen["p95_ttfb_ms"] >= 400
        metrics_when(up, nothing_waits)


def test_a_primary_in_time_is_served_alone_and_a_failing_one_by_the_pair(
        tmp_path: Path) -> None:
    with stack(tmp_path, Behaviour(latency_s=0.05)) as (up, providers):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        assert [ask(client, n)[0] for n in range(4)] == ["s"] * 4
        assert len(providers.provider("fast").received) == 0
        text = metrics_when(up, lambda t: metric(t, "hedge_hedged") == 4)
        assert metric(text, "hedge_second_attempts") == 0
        providers.provider("slow").behaviour = Behaviour(status=503)
        assert ask(client, 9)[0] == "f"
        metrics_when(up, lambda t: metric(t, "hedge_second_attempts") == 1)
        metrics_when(up, nothing_waits)  # the pair's failure, paired with the fallback


def test_the_budget_bounds_the_hedges(tmp_path: Path) -> None:
    with stack(tmp_path, Behaviour(latency_s=1.0), budget=50, burst=1) as (up, _):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        served = [ask(client, n) for n in range(4)]
        # Half a token a decision, the bucket empty at first, a spent hedge not given back:
        # every other request hedges; the others wait for the slow primary.
        assert [model for model, _ in served] == ["s", "f", "s", "f"]
        assert served[0][1] >= 1.0 and served[2][1] >= 1.0
        text = metrics_when(up, lambda t: metric(t, "hedge_second_won") == 2)
        assert metric(text, "hedge_hedged") == 2 and metric(text, "hedge_no_budget") == 2


def test_with_the_reply_gate_a_stream_races_to_its_first_event(tmp_path: Path) -> None:
    """The slow target sends its headers at once and its first event late: only the gate
    (`commit_at_first_event`) holds the headers until the first event, so the hedge still
    starts at the deadline and the fast target's first event wins."""
    slow = Behaviour(first_event_delay_s=SLOW_S)
    with stack(tmp_path, slow, gate=True) as (up, providers):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        model, took = ask(client, 1, stream=True)
        assert model == "f" and 0.35 < took < SLOW_S - 1.0, took
        metrics_when(up, lambda t: metric(t, "hedge_second_won") == 1)
        # The loser was cancelled: its connection is gone when it sends its first event.
        deadline = time.monotonic() + SLOW_S + 5
        while providers.provider("slow").cancelled < 1:
            assert time.monotonic() < deadline, "the slow attempt was never cancelled"
            time.sleep(0.05)
