"""A group's canary through real Envoy (issue 42, docs/rollout.md): a candidate whose new
target fails is withdrawn within one observation window — the callers never see it (the
live target answers by fallback), the event is in `/metrics`, the sidecar's log, the rows
and the decisions report, and the configuration file is untouched — while a healthy
candidate keeps its share, and a conversation its candidate pinned stays on its target.

(tests/e2e/test_canary.py is the secrets canary, another thing.)"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import time

import httpx
import openai
import pytest

from sidecar.devstack.harness import UpProcess, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "canary-rollout-token"
WINDOW_S = 20
KEYS = {name: f"key-{name}" for name in ("old", "broken", "steady", "fresh")}
CONFIG = """\
providers:
{providers}
callers: [{{name: team, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 20, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  breaking:
    strategy: weighted
    routing_policy: {{dynamic_score: {{observation_window_seconds: {window}}}}}
    targets:
      - {{provider: old, model_ref: o}}
      - {{provider: broken, model_ref: b}}
    rollout:
      canary:
        share_percent: 50
        targets: [broken/b]
        weights: {{old/o: 0}}
        guards: {{max_error_rate: 0.2, min_requests: 10}}
  healthy:
    strategy: dynamic_score
    targets:
      - {{provider: steady, model_ref: s}}
      - {{provider: fresh, model_ref: f}}
    routing_policy:
      dynamic_score:
        observation_window_seconds: {window}
        affinity: {{ttl_seconds: 600}}
    rollout:
      canary:
        share_percent: 30
        targets: [fresh/f]
        weights: {{steady/s: 0}}
        guards: {{max_error_rate: 0.2, max_p95_latency_ms: 5000, min_requests: 10}}
"""


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^sidecar_{name}{{{re.escape(wanted)}}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("canary-rollout")
    db = tmp / "telemetry.db"
    fakes = [FakeProvider("old", api_key=KEYS["old"]),
             FakeProvider("broken", api_key=KEYS["broken"], behaviour=Behaviour(status=500)),
             FakeProvider("steady", api_key=KEYS["steady"]),
             FakeProvider("fresh", api_key=KEYS["fresh"])]

    def config_text(providers) -> str:
        lines = "\n".join(f"  {name}: {{base_url: '{providers.base_url(name)}', "
                          f"credential: {{env: KEY_{name.upper()}}}}}" for name in KEYS)
        return CONFIG.format(providers=lines, db=db, window=WINDOW_S,
                             digest=hashlib.sha256(TOKEN.encode()).hexdigest())

    with keyed_stack(tmp, fakes, config_text, KEYS) as (up, providers):
        yield up, providers, tmp, db


def client(up) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)


def test_a_failing_candidate_is_withdrawn_within_a_window_and_callers_never_see_it(
        stack) -> None:
    up, providers, tmp, _ = stack
    config_before = (tmp / "config.yaml").read_bytes()
    caller = client(up)
    admin = f"http://127.0.0.1:{up.admin_http_port}/metrics"
    started = time.monotonic()
    withdrawn_after = None
    for n in range(200):
        reply = caller.chat.completions.create(
            model="breaking", messages=[{"role": "user", "content": f"breaking {n}"}])
        assert reply.model == "o"        # the live target answered, first or by fallback
        if n % 10 == 9:
            text = httpx.get(admin, timeout=5).text
            if metric(text, "canary_serving", group="breaking") == 0:
                withdrawn_after = time.monotonic() - started
                break
    assert withdrawn_after is not None, "the failing canary was never withdrawn"
    assert withdrawn_after < WINDOW_S
    assert metric(text, "canary_withdrawals_total", group="breaking",
                  guard="max_error_rate") == 1
    # From now on the candidate decides nothing: the broken target gets no request.
    tried = len(providers.provider("broken").received)
    assert tried >= 10
    for n in range(20):
        caller.chat.completions.create(
            model="breaking", messages=[{"role": "user", "content": f"after {n}"}])
    assert len(providers.provider("broken").received) == tried
    text = httpx.get(admin, timeout=5).text
    assert metric(text, "canary_decisions_total", group="breaking", side="withdrawn") > 0
    assert (tmp / "config.yaml").read_bytes() == config_before
    log = (tmp / "up.log").read_text()
    [line] = [line for line in log.splitlines() if "canary_withdrawn" in line]
    event = json.loads(line[line.index("{"):])
    assert (event["group"], event["guard"], event["window_s"]) == (
        "breaking", "max_error_rate", WINDOW_S)


def test_a_healthy_candidate_keeps_its_share_and_its_pins(stack) -> None:
    up, _, _, _ = stack
    caller = client(up)
    firsts: dict[int, str] = {}
    for n in range(120):
        reply = caller.chat.completions.create(
            model="healthy", messages=[{"role": "user", "content": f"healthy {n}"}])
        firsts[n] = reply.model
    # 30 % of conversations by their opening's hash: 36 of 120 expected.
    share = sum(model == "f" for model in firsts.values()) / len(firsts)
    assert 0.15 <= share <= 0.45, share
    # A conversation the candidate served keeps its target on the next turn.
    for n in [n for n, model in firsts.items() if model == "f"][:5]:
        reply = caller.chat.completions.create(model="healthy", messages=[
            {"role": "user", "content": f"healthy {n}"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and then?"}])
        assert reply.model == "f"
    text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text
    assert metric(text, "canary_serving", group="healthy") == 1
    assert metric(text, "canary_withdrawals_total", group="healthy",
                  guard="max_error_rate") is None
    assert metric(text, "canary_window_requests", group="healthy") >= 10
    assert metric(text, "canary_error_rate", group="healthy") == 0


def test_rows_and_the_decisions_report_show_the_sides_and_the_withdrawal(stack) -> None:
    _, _, _, db = stack
    deadline = time.monotonic() + 20
    while True:   # the rows reach the database a moment after the requests
        with sqlite3.connect(db) as connection:
            sides = dict(connection.execute(
                "SELECT canary, COUNT(*) FROM request_rows WHERE group_name = 'breaking' "
                "GROUP BY canary").fetchall())
            events = connection.execute(
                "SELECT group_name, event, guard, requests FROM canary_events").fetchall()
            # The healthy group's rows too: the worker writes them when it has the CPU.
            healthy = connection.execute(
                "SELECT COUNT(*) FROM request_rows WHERE group_name = 'healthy' "
                "AND canary = 'canary'").fetchone()[0]
        if events and sides.get("withdrawn", 0) >= 5 and healthy >= 5:
            break
        assert time.monotonic() < deadline, (sides, events)
        time.sleep(0.2)
    assert sides["canary"] >= 10 and sides["live"] > 0
    [(group, kind, guard, requests)] = events
    assert (group, kind, guard) == ("breaking", "withdrawn", "max_error_rate")
    assert requests >= 10
    done = subprocess.run([sys.executable, "-m", "sidecar", "report", "decisions", "--db",
                           str(db), "--by", "group", "--format", "json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    canary = json.loads(done.stdout)["canary"]
    assert [e["guard"] for e in canary["events"]] == ["max_error_rate"]
    by_side = {(row["group"], row["side"]): row for row in canary["sides"]}
    assert by_side[("breaking", "canary")]["policy_version"] != \
        by_side[("breaking", "live")]["policy_version"]
    assert by_side[("healthy", "canary")]["failed"] == 0
    text = subprocess.run([sys.executable, "-m", "sidecar", "report", "decisions", "--db",
                           str(db), "--by", "group"], capture_output=True, text=True,
                          timeout=60).stdout
    assert "canaries withdrawn:" in text and "max_error_rate" in text


def test_a_second_replica_on_the_same_database_starts_with_the_candidate_withdrawn(
        stack) -> None:
    """Another `sidecar up` on the same configuration and telemetry database (a replica, or
    the same one after a restart) reads the recorded withdrawal before any request of its
    own: the failing candidate stays out, the healthy one serves."""
    _, _, tmp, _ = stack
    keys = {f"KEY_{name.upper()}": key for name, key in KEYS.items()}
    second = UpProcess(["--config", str(tmp / "config.yaml")], env=keys,
                       log_path=tmp / "second.log")
    with second.running():
        deadline = time.monotonic() + 15
        while True:
            text = httpx.get(f"http://127.0.0.1:{second.admin_http_port}/metrics",
                             timeout=5).text
            if metric(text, "canary_serving", group="breaking") == 0:
                break
            assert time.monotonic() < deadline, "the recorded withdrawal was not read"
            time.sleep(0.2)
        assert metric(text, "canary_withdrawals_total", group="breaking",
                      guard="recorded") == 1
        assert metric(text, "canary_serving", group="healthy") == 1
        reply = client(second).chat.completions.create(
            model="breaking", messages=[{"role": "user", "content": "breaking 0"}])
        assert reply.model == "o"
