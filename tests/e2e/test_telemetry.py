"""Telemetry through the real stack (issue #15, first increment): every routed request
becomes exactly one joined row in SQLite with its serving target, tokens and cost, every
pre-commit failure one fallback row, and a caller cannot choose the join's request id."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from sidecar.devstack.harness import UpProcess, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "telemetry-caller-token"
KEYS = {"good": "key-good", "flaky": "key-flaky"}
CONFIG = """\
providers:
  good:
    base_url: '{good}'
    credential: {{env: KEY_GOOD}}
    dialects: [openai_chat, anthropic_messages]
  flaky: {{base_url: '{flaky}', credential: {{env: KEY_FLAKY}}}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}', replica: e2e}}
models:
  chain:
    strategy: failover
    # one attempt per target: these tests count rows per fallback (the default same-target
    # retry of a 5xx has its own tests, tests/e2e/fallback)
    fallback: {{retry_same_target: 0}}
    targets:
      - provider: flaky
        model_ref: flaky-model
        pricing: {{input_per_mtok: 3, output_per_mtok: 15}}
      - provider: good
        model_ref: good-model
        pricing: {{input_per_mtok: 1, output_per_mtok: 4}}
  claude:
    targets:
      - provider: good
        model_ref: good-claude
        api: anthropic_messages
        pricing: {{input_per_mtok: 2, output_per_mtok: 8}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, Path, dict]]:
    workdir = tmp_path_factory.mktemp("telemetry")
    db = workdir / "telemetry.db"
    fakes = [FakeProvider("good", api_key=KEYS["good"]),
             FakeProvider("flaky", api_key=KEYS["flaky"])]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            good=providers.base_url("good"), flaky=providers.base_url("flaky"), db=db,
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS,
            "--log-format", "json", "--log-decisions",
            # The file says `replica: e2e`; the command line wins (issue #30.5), in the
            # telemetry worker's process too.
            "--replica", "pod-e2e-0") as (up, providers):
        yield up, db, {"flaky": providers.provider("flaky"), "good": providers.provider("good")}


def rows(db: Path, table: str, expected: int, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            found = [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def since(db: Path, table: str, column: str, start: float, expected: int,
          timeout_s: float = 30.0) -> list[dict]:
    """The rows whose `column` time is at or after `start`, once `expected` are there (rows
    of earlier tests may still be arriving)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [r for r in rows(db, table, 0) if r[column] >= start]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_each_request_one_joined_row_with_usage_cost_and_fallbacks(stack) -> None:
    up, db, fakes = stack
    seen = {r["request_id"] for r in rows(db, "request_rows", 0)}
    seen_transitions = len(rows(db, "fallback_transitions", 0))
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    fakes["flaky"].behaviour = Behaviour(status=503)  # every request falls back once
    messages = [{"role": "user", "content": "hello telemetry"}]
    unary = client.chat.completions.create(model="chain", messages=messages)
    streamed = list(client.chat.completions.create(
        model="chain", messages=messages, stream=True, stream_options={"include_usage": True}))
    fakes["flaky"].behaviour = Behaviour()
    direct = client.chat.completions.with_raw_response.create(
        model="chain", messages=messages, extra_headers={"x-request-id": "caller-chosen"})

    found = [r for r in rows(db, "request_rows", len(seen) + 3) if r["request_id"] not in seen]
    assert len(found) == 3
    assert {r["join_kind"] for r in found} == {"joined"}
    assert {r["caller"] for r in found} == {"team-a"}
    assert {r["replica"] for r in found} == {"pod-e2e-0"}
    assert "caller-chosen" not in {r["request_id"] for r in found}
    by_serving = sorted((r["serving_target"], r["attempts"]) for r in found)
    assert by_serving == [("flaky/flaky-model", 1), ("good/good-model", 2),
                          ("good/good-model", 2)]
    usage = {(unary.usage.prompt_tokens, unary.usage.completion_tokens),
             (streamed[-1].usage.prompt_tokens, streamed[-1].usage.completion_tokens)}
    fallen_back = [r for r in found if r["attempts"] == 2]
    assert {(r["input_tokens"], r["output_tokens"]) for r in fallen_back} == usage
    for r in fallen_back:
        assert r["selected_target"] == "flaky/flaky-model" and r["status_class"] == "2xx"
        assert r["cost_usd"] == pytest.approx(
            (r["input_tokens"] * 1 + r["output_tokens"] * 4) / 1e6)
    served = next(r for r in found if r["attempts"] == 1)
    assert served["cost_usd"] == pytest.approx(
        (served["input_tokens"] * 3 + served["output_tokens"] * 15) / 1e6)
    assert json.loads(served["request_shape"])["dialect"] == "openai_chat"
    assert direct.http_response.status_code == 200
    # Every decision's odds and policy (issue #31): a failover group picks with certainty.
    versions = {r["policy_version"] for r in found}
    assert len(versions) == 1 and int(versions.pop(), 16) >= 0
    for r in found:
        assert (r["selection_probability"], r["selection_reason"]) == (1.0, "declared_order")
        assert json.loads(r["candidate_odds"]) == {"flaky/flaky-model": 1.0,
                                                   "good/good-model": 0.0}
        assert r["estimated_input_tokens"] == 4 and r["output_budget"] == 1024

    transitions = rows(db, "fallback_transitions", seen_transitions + 2)[seen_transitions:]
    assert sorted((t["from_target"], t["to_target"], t["failure"]) for t in transitions) == [
        ("flaky/flaky-model", "good/good-model", "server_error")] * 2
    assert {t["request_id"] for t in transitions} == {r["request_id"] for r in fallen_back}


def test_requests_refused_before_routing_make_no_row(stack) -> None:
    up, db, _ = stack
    before = len(rows(db, "request_rows", 0))
    bad = openai.OpenAI(base_url=up.base_url + "/v1", api_key="wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="chain", messages=[{"role": "user", "content": "x"}])
    time.sleep(0.5)  # the access log flushes every 50 ms; the writer every 250 ms
    assert len(rows(db, "request_rows", 0)) == before


def test_anthropic_replies_json_and_streamed_report_their_input_tokens(stack) -> None:
    """An Anthropic stream says its input tokens in `message_start`, its output tokens in
    the last `message_delta`: both reach the row, as a JSON reply's `usage` does."""
    up, db, _ = stack
    before = len(rows(db, "request_rows", 0))
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
    messages = [{"role": "user", "content": "hello from claude"}]
    unary = client.messages.create(model="claude", max_tokens=64, messages=messages)
    with client.messages.stream(model="claude", max_tokens=64, messages=messages) as stream:
        final = stream.get_final_message()
    found = [r for r in rows(db, "request_rows", before + 2) if r["group_name"] == "claude"]
    assert len(found) == 2
    assert sorted((r["input_tokens"], r["output_tokens"]) for r in found) == sorted(
        [(unary.usage.input_tokens, unary.usage.output_tokens),
         (final.usage.input_tokens, final.usage.output_tokens)])
    for r in found:
        assert r["cost_usd"] == pytest.approx(
            (r["input_tokens"] * 2 + r["output_tokens"] * 8) / 1e6)


def test_metrics_count_routed_requests_fallbacks_and_observations(stack) -> None:
    """`/metrics` on the admin port, in Prometheus' text format, after the requests above."""
    import httpx

    up, db, fakes = stack
    before = len(rows(db, "request_rows", 0))
    fakes["flaky"].behaviour = Behaviour(status=503)
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "m"}])
    fakes["flaky"].behaviour = Behaviour()
    rows(db, "request_rows", before + 1)
    # The worker reports its counts every 0.5 s, after it wrote the row: wait for them.
    transition = ('sidecar_fallback_transitions_total{failure="server_error",'
                  'from_target="flaky/flaky-model",group="chain",to_target="good/good-model"}')
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5)
        text = response.text
        if transition in text and 'sidecar_decisions_total{group="chain"' in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'sidecar_decisions_total{group="chain",status_class="2xx",strategy="failover"' in text
    assert transition in text
    assert 'sidecar_target_observations{target="good/good-model"}' in text
    for gauge in ("sidecar_telemetry_queue_depth", "sidecar_telemetry_dropped_queue_full",
                  "sidecar_ext_proc_streams", "sidecar_grpc_", "# TYPE sidecar_affinity_pins",
                  "# TYPE sidecar_ejected_targets"):
        assert gauge in text
    assert TOKEN not in text and "team-a" not in text  # no caller names or tokens as labels


def test_with_log_format_json_every_sidecar_line_is_a_json_object(stack) -> None:
    up, _, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "j"}])
    assert up.log_path is not None
    lines = up.log_path.read_text().splitlines()
    ours = [json.loads(line) for line in lines if line.startswith("{")]
    # Envoy's own lines (its format, "[date] ...") share the stream; every other line is ours.
    assert all(line.startswith(("{", "[")) for line in lines if line.strip())
    decisions = [o for o in ours if o["logger"] == "sidecar.decision"]
    assert decisions and decisions[-1]["event"]["event"] == "decision"
    assert all({"ts", "level", "logger"} <= set(o) for o in ours)


def test_under_concurrent_load_every_request_yields_exactly_one_row(stack) -> None:
    """Fallbacks, streams and cancelled streams at once: N requests, N joined rows, one
    fallback row per failed attempt, each row on the target that really served it."""
    import asyncio

    import httpx

    up, db, fakes = stack
    seen = {r["request_id"] for r in rows(db, "request_rows", 0)}
    url = up.base_url + "/v1/chat/completions"
    headers = {"authorization": f"Bearer {TOKEN}"}

    def body(n: int, stream: bool = False) -> dict:
        return {"model": "chain", "stream": stream,
                "messages": [{"role": "user", "content": f"load {n}"}]}

    async def unary(client: httpx.AsyncClient, n: int) -> str:
        response = await client.post(url, json=body(n), headers=headers)
        assert response.status_code == 200
        return response.json()["model"]

    async def streamed(client: httpx.AsyncClient, n: int, cancel: bool = False) -> None:
        async with client.stream("POST", url, json=body(n, True), headers=headers) as response:
            assert response.status_code == 200
            async for _ in response.aiter_bytes():
                if cancel:
                    return  # the caller goes away after the first bytes

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            fakes["flaky"].behaviour = Behaviour(status=503)
            served = await asyncio.gather(*(unary(client, n) for n in range(15)))
            assert set(served) == {"good-model"}
            fakes["flaky"].behaviour = Behaviour()
            await asyncio.gather(*(unary(client, n) for n in range(15, 30)),
                                 *(streamed(client, n) for n in range(30, 45)))
            fakes["flaky"].behaviour = Behaviour(inter_event_delay_s=0.2)
            await asyncio.gather(*(streamed(client, n, cancel=True) for n in range(45, 55)))
            fakes["flaky"].behaviour = Behaviour()

    started = time.time()
    asyncio.run(run())
    # Rows of earlier tests may still be arriving: count only requests decided from now on.
    found = [r for r in since(db, "request_rows", "started_at", started, 55)
             if r["request_id"] not in seen]
    assert len(found) == 55 and len({r["request_id"] for r in found}) == 55
    assert {r["join_kind"] for r in found} == {"joined"}
    by_target = {t: sum(r["serving_target"] == t for r in found)
                 for t in ("good/good-model", "flaky/flaky-model")}
    assert by_target == {"good/good-model": 15, "flaky/flaky-model": 40}
    cancelled = [r for r in found if r["error_class"] == "client_cancel"]
    assert len(cancelled) == 10
    transitions = since(db, "fallback_transitions", "at", started, 15)
    assert len(transitions) == 15
