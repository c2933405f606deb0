"""Caller quotas through real Envoy (issue #17): each limit at its boundary answers 429 in
the caller's dialect with `retry-after` and leaves a telemetry row naming the limit; two
sidecar replicas sharing one real Redis enforce one limit within the documented
over-admission; with Redis down they keep serving under local limits and say so."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import FakeProvider
from tests.redis_server import RedisServer

pytestmark = pytest.mark.e2e

TOKENS = {"rpm-openai": "q-token-1", "rpm-anthropic": "q-token-2", "tokens": "q-token-3",
          "spend": "q-token-4", "shared": "q-token-5", "tokens-anthropic": "q-token-6",
          "spend-anthropic": "q-token-7"}
CONFIG = """\
providers:
  both: {{base_url: '{both}', credential: {{env: KEY_BOTH}},
          dialects: [openai_chat, anthropic_messages]}}
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
{quotas}
callers:
  - {{name: rpm-openai, token_sha256: {rpm-openai}, quotas: {{requests_per_minute: 2}}}}
  - {{name: rpm-anthropic, token_sha256: {rpm-anthropic},
      quotas: {{per_group: {{chat: {{requests_per_minute: 2}}}}}}}}
  - {{name: tokens, token_sha256: {tokens}, quotas: {{tokens_per_day: 10}}}}
  - {{name: spend, token_sha256: {spend}, quotas: {{spend_per_day_usd: 0.001}}}}
  - {{name: shared, token_sha256: {shared}, quotas: {{requests_per_minute: 10}}}}
  - {{name: tokens-anthropic, token_sha256: {tokens-anthropic}, quotas: {{tokens_per_day: 10}}}}
  - {{name: spend-anthropic, token_sha256: {spend-anthropic},
      quotas: {{spend_per_day_usd: 0.001}}}}
models:
  chat:
    targets:
      - {{provider: both, model_ref: both-model,
          pricing: {{input_per_mtok: 100, output_per_mtok: 100}}}}
"""


def start(workdir: Path, providers: ProviderThread, quotas: str = "") -> UpProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(CONFIG.format(
        both=providers.base_url("both"), db=workdir / "telemetry.db", quotas=quotas,
        **{name: hashlib.sha256(token.encode()).hexdigest() for name, token in TOKENS.items()}))
    up = UpProcess(["--config", str(config)], env={"KEY_BOTH": "key-both"},
                   log_path=workdir / "up.log")
    up.db = workdir / "telemetry.db"
    return up


@pytest.fixture(scope="module")
def providers() -> Iterator[ProviderThread]:
    with ProviderThread([FakeProvider("both", api_key="key-both")]) as running:
        yield running


@pytest.fixture(scope="module")
def stack(providers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with start(tmp_path_factory.mktemp("quotas"), providers).running() as up:
        yield up


def same_minute() -> None:
    """Minute windows are UTC minutes: keep a test's requests inside one."""
    if time.time() % 60 > 45:  # a loop of 40 requests took 4.3 s: 4x margin
        time.sleep(60.5 - time.time() % 60)


def openai_client(up: UpProcess, who: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKENS[who], max_retries=0)


def chat(up: UpProcess, who: str) -> None:
    openai_client(up, who).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}])


def admission_rows(up: UpProcess, caller: str) -> list[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(up.db) as conn:
            found = [r[0] for r in conn.execute(
                "SELECT admission FROM request_rows WHERE caller = ? AND admission IS NOT NULL",
                (caller,))]
        if found:
            return found
        time.sleep(0.05)
    return []


def test_requests_per_minute_in_the_openai_dialect(stack) -> None:
    same_minute()
    chat(stack, "rpm-openai")
    chat(stack, "rpm-openai")
    with pytest.raises(openai.RateLimitError) as refused:
        chat(stack, "rpm-openai")
    response = refused.value.response
    assert response.status_code == 429
    assert 1 <= int(response.headers["retry-after"]) <= 60
    body = response.json()["error"]
    assert body["code"] == "rate_limit_exceeded" and "requests_per_minute" in body["message"]
    assert admission_rows(stack, "rpm-openai") == ["caller_requests_per_minute"]


def test_a_per_group_limit_in_the_anthropic_dialect(stack) -> None:
    same_minute()
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=TOKENS["rpm-anthropic"],
                                 max_retries=0)

    def ask() -> None:
        client.messages.create(model="chat", max_tokens=16,
                               messages=[{"role": "user", "content": "hi"}])

    ask()
    ask()
    with pytest.raises(anthropic.RateLimitError) as refused:
        ask()
    response = refused.value.response
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert admission_rows(stack, "rpm-anthropic") == ["group_requests_per_minute"]


def message(up: UpProcess, who: str) -> None:
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKENS[who], max_retries=0)
    client.messages.create(model="chat", max_tokens=16,
                           messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(("who", "reason"), [
    ("tokens", "caller_tokens_per_day"), ("spend", "caller_spend_per_day_usd"),
    ("tokens-anthropic", "caller_tokens_per_day"),
    ("spend-anthropic", "caller_spend_per_day_usd")])
def test_tokens_and_spend_per_day_refuse_once_used(stack, who, reason) -> None:
    """The fake provider reports usage; once the access log counted it past the limit
    (10 tokens; $0.001 at $100 per million tokens), the next request is refused until
    the UTC day ends."""
    send, refusal = ((message, anthropic.RateLimitError) if who.endswith("anthropic")
                     else (chat, openai.RateLimitError))
    deadline = time.monotonic() + 30
    while True:
        try:
            send(stack, who)
        except refusal as refused:
            seconds = int(refused.response.headers["retry-after"])
            assert 0 < seconds <= 86_400
            break
        assert time.monotonic() < deadline, "never refused"
        time.sleep(0.1)  # the usage arrives with the access log (flushed every 50 ms)
    assert admission_rows(stack, who) == [reason]


def test_the_decisions_report_counts_admission_buckets(stack) -> None:
    for who in ("rpm-openai", "tokens"):
        assert admission_rows(stack, who)  # the earlier tests' refusals are written
    done = subprocess.run([sys.executable, "-m", "sidecar", "report", "decisions", "--db",
                           str(stack.db), "--since", "1h", "--format", "json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    admission: dict[str, int] = {}
    for row in json.loads(done.stdout)["rows"]:
        for bucket, count in row["admission"].items():
            admission[bucket] = admission.get(bucket, 0) + count
    assert admission["caller_requests_per_minute"] >= 1
    assert admission["caller_tokens_per_day"] >= 1
    assert admission["none"] >= 1  # the admitted ones


def metric(up: UpProcess, name: str) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_two_replicas_share_one_limit_through_redis(providers, redis: RedisServer,
                                                    tmp_path: Path) -> None:
    """10 a minute for `shared`, two replicas, slice max(1, 10 %) = 1: together they admit
    between 10 and 10 + 2 × 1; each alone would have admitted 10."""
    quotas = "quotas: {redis_url: {env: QUOTA_REDIS}, reconcile_ms: 50}"
    replicas = [start(tmp_path / f"replica{i}", providers, quotas) for i in (1, 2)]
    for up in replicas:
        up.env["QUOTA_REDIS"] = redis.url
    with replicas[0].running() as one, replicas[1].running() as two:
        same_minute()
        outcomes = []
        for index in range(40):
            try:
                chat((one, two)[index % 2], "shared")
                outcomes.append(200)
            except openai.RateLimitError:
                outcomes.append(429)
            time.sleep(0.06)  # about one reconciliation between requests
        admitted = outcomes.count(200)
        assert 10 <= admitted <= 12, outcomes
        assert metric(one, "sidecar_quota_redis_up") == 1.0

        # Redis down: both keep serving under their own limits and say so.
        redis.stop()
        deadline = time.monotonic() + 10
        while metric(one, "sidecar_quota_redis_up") != 0.0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for up in (one, two):  # requests keep flowing, admitted by local counters
            chat(up, "rpm-openai")
        assert (metric(one, "sidecar_quota_redis_errors_total") or 0) >= 1
        assert metric(two, "sidecar_quota_redis_up") == 0.0
