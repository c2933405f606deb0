"""Shadow traffic through real Envoy (issue 42, docs/rollout.md §4): live requests of a
group are mirrored to a candidate target through Envoy's shadow listener — rewritten for
it, its key injected by Envoy — while the caller's answer, latency and bill are those of
the same group without a mirror; the candidate's observations fill, each mirrored request
is paired with its live answer in `shadow_requests`, each bound stops the mirror, and a
slow or dead candidate costs the caller nothing it can see.

(Shadow *policies*, counterfactual decisions with no traffic, are tests/e2e/test_shadow.py.)"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import statistics
import time
from pathlib import Path

import httpx
import openai
import pytest

from sidecar.devstack.harness import free_port, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "shadow-traffic-token"
KEYS = {"live": "key-live", "cand": "key-cand", "slow": "key-slow", "gone": "key-gone",
        "anth": "key-anth"}
PRICE = "{input_per_mtok: 1, output_per_mtok: 2}"
CONFIG = """\
providers:
{providers}
callers: [{{name: team, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 20, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  plain:
    targets: [{{provider: live, model_ref: l, pricing: {price}}}]
  mirrored:
    targets:
      - {{provider: live, model_ref: l, pricing: {price}}}
      - {{provider: cand, model_ref: c, pricing: {price}}}
    rollout:
      shadow_traffic: {{target: cand/c, shadow_only: true, sample_percent: 100,
                        max_per_minute: 6000, max_concurrent: 16}}
  per-minute:
    targets:
      - {{provider: live, model_ref: l, pricing: {price}}}
      - {{provider: cand, model_ref: c2, pricing: {price}}}
    rollout:
      shadow_traffic: {{target: cand/c2, shadow_only: true, sample_percent: 100,
                        max_per_minute: 3}}
  daily:
    targets:
      - {{provider: live, model_ref: l, pricing: {price}}}
      - {{provider: cand, model_ref: c3, pricing: {{input_per_mtok: 100000,
                                                 output_per_mtok: 100000}}}}
    rollout:
      shadow_traffic: {{target: cand/c3, shadow_only: true, sample_percent: 100,
                        max_daily_usd: 1.0}}
  slow:
    targets:
      - {{provider: live, model_ref: l, pricing: {price}}}
      - {{provider: slow, model_ref: s, pricing: {price}}}
    rollout:
      shadow_traffic: {{target: slow/s, shadow_only: true, sample_percent: 100,
                        max_concurrent: 2, max_per_minute: 6000}}
  bridged:
    bridges: true
    targets:
      - {{provider: live, model_ref: l, pricing: {price}}}
      - {{provider: anth, model_ref: a, pricing: {price}}}
    rollout:
      shadow_traffic: {{target: anth/a, shadow_only: true, sample_percent: 100,
                        max_per_minute: 6000}}
  dead:
    targets:
      - {{provider: live, model_ref: l, pricing: {price}}}
      - {{provider: gone, model_ref: g, pricing: {price}}}
    rollout:
      shadow_traffic: {{target: gone/g, shadow_only: true, sample_percent: 100,
                        max_per_minute: 6000}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shadow-traffic")
    db = tmp / "telemetry.db"
    # Both answer a request that offers tools with a call to its first tool.
    fakes = [FakeProvider("live", api_key=KEYS["live"], behaviour=Behaviour(call_tools=True)),
             FakeProvider("cand", api_key=KEYS["cand"], behaviour=Behaviour(call_tools=True)),
             FakeProvider("slow", api_key=KEYS["slow"], behaviour=Behaviour(latency_s=1.5)),
             FakeProvider("anth", api_key=KEYS["anth"])]
    closed = free_port()   # nothing listens there: a candidate that is down

    def config_text(providers) -> str:
        urls = {name: providers.base_url(name) for name in ("live", "cand", "slow", "anth")}
        urls["gone"] = f"http://127.0.0.1:{closed}/v1"
        lines = "\n".join(f"  {name}: {{base_url: '{url}', "
                          f"credential: {{env: KEY_{name.upper()}}}"
                          + (", dialects: [anthropic_messages]" if name == "anth" else "")
                          + "}" for name, url in urls.items())
        return CONFIG.format(providers=lines, db=db, price=PRICE,
                             digest=hashlib.sha256(TOKEN.encode()).hexdigest())

    with keyed_stack(tmp, fakes, config_text, KEYS) as (up, providers):
        yield up, providers, db


def metrics(up) -> str:
    return httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^sidecar_{name}{{{re.escape(wanted)}}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def wait_for(check, what: str, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def metrics_once(up, ready, what: str) -> str:
    """`/metrics` once `ready(text)` holds."""
    def check() -> str | None:
        text = metrics(up)
        return text if ready(text) else None
    return wait_for(check, what)


def ask(client: openai.OpenAI, group: str, n: int, **extra):
    return client.chat.completions.create(
        model=group, messages=[{"role": "user", "content": f"mirror question {n}"}], **extra)


def test_the_caller_gets_the_live_answer_and_the_candidate_gets_its_own_request(stack) -> None:
    up, providers, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    for n in range(12):
        plain, mirrored = ask(client, "plain", n), ask(client, "mirrored", n)
        # The same answer as the group without a mirror: the live target's, never the
        # candidate's.
        assert mirrored.model == plain.model == "l"
        assert mirrored.choices[0].message.content == plain.choices[0].message.content
        assert mirrored.usage.completion_tokens == plain.usage.completion_tokens
    streamed = list(client.chat.completions.create(
        model="mirrored", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "mirror question stream"}]))
    assert streamed[-1].usage is not None
    cand = providers.provider("cand")
    wait_for(lambda: len([r for r in cand.received if r.json()["model"] == "c"]) >= 13,
             "the candidate did not get every mirrored request")
    mirrored_requests = [r for r in cand.received if r.json()["model"] == "c"]
    for request in mirrored_requests:
        assert request.path == "/cand/v1/chat/completions"  # its provider's base URL
        assert request.headers["authorization"] == f"Bearer {KEYS['cand']}"  # by Envoy
        assert "x-sidecar-shadow-token" not in request.headers
        assert "x-sidecar-answer-facts" not in request.headers
        assert "x-sidecar-shadow-cluster" not in request.headers
        assert TOKEN not in str(request.headers)
    assert any(r.json().get("stream") for r in mirrored_requests)
    # The live requests' marker (Envoy reads their answers) never reaches the provider.
    assert not any("x-sidecar-answer-facts" in r.headers
                   for r in providers.provider("live").received)
    # The candidate's observations, beside the live target's.
    text = metrics_once(up, lambda t: (metric(t, "target_observations", target="cand/c")
                                       or 0) >= 13,
                        "the candidate's answers did not feed its observations")
    assert metric(text, "shadow_traffic_requests_total", group="mirrored", outcome="sent") == 13
    assert metric(text, "shadow_traffic_answers_total", group="mirrored",
                  result="answered") == 13


def test_mirrored_requests_are_paired_with_their_live_rows_and_never_billed(stack) -> None:
    _, _, db = stack

    def rows():
        with sqlite3.connect(db) as connection:
            paired = connection.execute(
                "SELECT s.live_request_id, s.candidate, s.both_answered, s.output_ratio, "
                "s.shadow_cost_usd, s.live_cost_usd, r.serving_target, s.shadow_ttft_ms "
                "FROM shadow_requests s JOIN request_rows r "
                "ON r.request_id = s.live_request_id WHERE s.group_name = 'mirrored'"
            ).fetchall()
            billed = connection.execute(
                "SELECT COUNT(*), SUM(cost_usd) FROM request_rows "
                "WHERE group_name IN ('plain', 'mirrored') AND serving_target = 'cand/c'"
            ).fetchone()
        return (paired, billed) if len(paired) >= 13 else None

    paired, billed = wait_for(rows, "the shadow rows did not arrive")
    assert len(paired) == 13
    for _, candidate, both, ratio, shadow_cost, live_cost, serving, ttft in paired:
        assert candidate == "cand/c" and serving == "live/l"
        assert both == 1 and ratio is not None and ratio > 0
        assert shadow_cost > 0 and live_cost > 0 and ttft is not None
    assert billed == (0, None)   # no caller row is the candidate's


def test_each_bound_stops_the_mirror(stack) -> None:
    up, _, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    for n in range(8):
        assert ask(client, "per-minute", n).model == "l"
        assert ask(client, "daily", n).model == "l"
    text = metrics(up)
    assert metric(text, "shadow_traffic_requests_total", group="per-minute",
                  outcome="sent") == 3
    assert metric(text, "shadow_traffic_requests_total", group="per-minute",
                  outcome="max_per_minute") == 5
    # At $0.1 a token each request's estimate is far above $1: none is ever sent.
    assert metric(text, "shadow_traffic_requests_total", group="daily",
                  outcome="max_daily_usd") == 8
    assert metric(text, "shadow_traffic_requests_total", group="daily", outcome="sent") \
        is None


def test_a_slow_or_dead_candidate_costs_the_caller_nothing_it_can_see(stack) -> None:
    up, _, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)

    def timed(group: str, n: int) -> float:
        started = time.perf_counter()
        assert ask(client, group, n).model == "l"
        return time.perf_counter() - started

    plain = [timed("plain", n) for n in range(10)]
    slow = [timed("slow", n) for n in range(10)]
    dead = [timed("dead", n) for n in range(10)]
    # The candidate answers after 1.5 s; the caller waits for the live target only.
    assert statistics.median(slow) < 0.5 + 4 * statistics.median(plain)
    assert statistics.median(dead) < 0.5 + 4 * statistics.median(plain)
    text = metrics_once(up, lambda t: (metric(t, "shadow_traffic_answers_total",
                                              group="dead", result="failed") or 0) >= 10,
                        "the dead candidate's failures were not counted")
    # Two in flight at most: the rest of the slow candidate's share was not sent.
    assert metric(text, "shadow_traffic_requests_total", group="slow",
                  outcome="max_concurrent") >= 5
    assert (metric(text, "shadow_traffic_requests_total", group="slow", outcome="sent")
            or 0) <= 5


def test_the_shadow_listener_answers_only_the_sidecar(stack) -> None:
    """Loopback only, and even there: no channel token, no request reaches a provider."""
    up, providers, _ = stack
    before = len(providers.provider("cand").received)
    url = f"http://127.0.0.1:{up.shadow_port}/cand/v1/chat/completions"
    body = {"model": "c", "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"x-sidecar-shadow-token": "guess",
                         "x-sidecar-shadow-cluster": "target__mirrored__1__cand"},
                    {"x-sidecar-shadow-cluster": "target__mirrored__1__cand"}):
        reply = httpx.post(url, json=body, headers=headers, timeout=5)
        assert reply.status_code == 403
    assert len(providers.provider("cand").received) == before


def test_the_decisions_report_shows_the_candidate_beside_the_live_answers(stack) -> None:
    import json
    import subprocess
    import sys

    _, _, db = stack
    wait_for(lambda: sqlite3.connect(db).execute(
        "SELECT COUNT(*) FROM shadow_requests WHERE group_name = 'mirrored'").fetchone()[0]
        >= 13, "no shadow rows")
    done = subprocess.run([sys.executable, "-m", "sidecar", "report", "decisions", "--db",
                           str(db), "--format", "json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {row["group"]: row for row in json.loads(done.stdout)["shadow_traffic"]}
    mirrored = rows["mirrored"]
    assert mirrored["candidate"] == "cand/c" and mirrored["pairs"] >= 13
    assert mirrored["both_answered_rate"] == 1.0
    assert mirrored["candidate_p95_latency_ms"] > 0 and mirrored["live_p95_latency_ms"] > 0
    assert mirrored["candidate_mean_cost_usd"] > 0
    assert rows["dead"]["candidate_answered_rate"] == 0.0
    text = subprocess.run([sys.executable, "-m", "sidecar", "report", "decisions", "--db",
                           str(db)], capture_output=True, text=True, timeout=60).stdout
    assert "shadow traffic, candidates beside the live answers:" in text


def test_replay_reads_the_candidates_answers_where_the_log_has_none(stack, tmp_path) -> None:
    """The candidate made a live target half the time: the log never sent a request there,
    and the mirrored ones answer for it (no estimator needed on those rows)."""
    import json
    import subprocess
    import sys

    up, _, db = stack
    wait_for(lambda: sqlite3.connect(db).execute(
        "SELECT COUNT(*) FROM shadow_requests WHERE group_name = 'mirrored'").fetchone()[0]
        >= 13, "no shadow rows")
    text = Path(up.args[up.args.index("--config") + 1]).read_text()
    candidate = text.replace(
        "      - {provider: cand, model_ref: c, pricing: " + PRICE + "}\n"
        "    rollout:\n      shadow_traffic: {target: cand/c, shadow_only: true, "
        "sample_percent: 100,\n                        max_per_minute: 6000, "
        "max_concurrent: 16}\n",
        "      - {provider: cand, model_ref: c, pricing: " + PRICE + "}\n")
    assert candidate != text
    path = tmp_path / "candidate.yaml"
    path.write_text(candidate)
    done = subprocess.run([sys.executable, "-m", "sidecar", "replay", "--config", str(path),
                           "--db", str(db), "--since", "1h", "--group", "mirrored",
                           "--format", "json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **{f"KEY_{n.upper()}": k
                                                for n, k in KEYS.items()}})
    assert done.returncode == 0, done.stderr
    [group] = json.loads(done.stdout)["groups"]
    assert group["candidate_mass_with_shadow_support"] > 0.3
    paired = group["paired_with_shadow_traffic"]
    assert paired["latency_ms"]["n"] >= 10 and paired["cost_usd"]["candidate"] > 0


def test_two_replicas_each_mirror_their_own_requests_into_one_database(stack) -> None:
    """A second `sidecar up` (its own Envoy) on the same configuration and database: each
    replica mirrors the requests it decided, bounds its own mirror, and both pair theirs
    in the shared `shadow_requests`, told apart by replica."""
    from sidecar.devstack.harness import UpProcess

    up, providers, db = stack
    config = Path(up.args[up.args.index("--config") + 1])
    keys = {f"KEY_{name.upper()}": key for name, key in KEYS.items()}
    second = UpProcess(["--config", str(config), "--replica", "second"], env=keys,
                       log_path=config.parent / "second.log")
    cand = providers.provider("cand")
    before = len([r for r in cand.received if r.json()["model"] == "c"])
    with second.running():
        for replica in (up, second):
            client = openai.OpenAI(base_url=replica.base_url + "/v1", api_key=TOKEN,
                                   max_retries=0)
            for n in range(6):
                assert ask(client, "mirrored", 100 + n).model == "l"
        wait_for(lambda: len([r for r in cand.received if r.json()["model"] == "c"])
                 >= before + 12, "not every replica mirrored its requests")
        text = metrics(second)
        assert metric(text, "shadow_traffic_requests_total", group="mirrored",
                      outcome="sent") == 6
        def replicas() -> set[str] | None:
            found = {r for (r,) in sqlite3.connect(db).execute(
                "SELECT DISTINCT replica FROM shadow_requests WHERE group_name = 'mirrored'")}
            return found if len(found) >= 2 else None

        named = wait_for(replicas, "the second replica's rows did not arrive")
        assert any(name.startswith("second") for name in named)


def test_a_candidate_of_another_api_is_mirrored_through_the_groups_bridge(stack) -> None:
    """An OpenAI Chat caller, an Anthropic-only candidate: the request is translated as a
    bridged attempt is, sent to the candidate's own cluster in its own API, and its answer
    read in that API."""
    up, providers, db = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    for n in range(4):
        assert ask(client, "bridged", n).model == "l"
    anth = providers.provider("anth")
    wait_for(lambda: len(anth.received) >= 4, "the bridged candidate got no mirror")
    for request in anth.received:
        assert request.path.endswith("/v1/messages")
        body = request.json()
        assert body["model"] == "a" and body["messages"][0]["role"] == "user"
        assert "max_tokens" in body   # Anthropic's required field, filled in by the bridge

    def rows():
        found = sqlite3.connect(db).execute(
            "SELECT shadow_error_class, shadow_output_tokens, both_answered FROM "
            "shadow_requests WHERE group_name = 'bridged'").fetchall()
        return found if len(found) >= 4 else None

    for error_class, tokens, both in wait_for(rows, "no bridged shadow rows"):
        assert error_class == "ok" and tokens and both == 1
    text = metrics(up)
    assert metric(text, "shadow_traffic_requests_total", group="bridged", outcome="sent") == 4


def test_agreement_with_the_live_answer_finish_and_tools(stack) -> None:
    """Envoy reads how each mirrored request's live answer finished and which tools it
    called (a marker the sidecar sets on mirrored requests only): the rows say whether the
    candidate did the same, for JSON answers and streams."""
    up, _, db = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    for n in range(3):
        reply = client.chat.completions.with_raw_response.create(
            model="mirrored", tools=tools,
            messages=[{"role": "user", "content": f"weather {n}?"}])
        assert reply.parse().choices[0].message.tool_calls[0].function.name == "lookup"
    list(client.chat.completions.create(
        model="mirrored", tools=tools, stream=True,
        messages=[{"role": "user", "content": "weather, streamed?"}]))

    def rows():
        found = sqlite3.connect(db).execute(
            "SELECT live_finish, live_tools, shadow_finish, shadow_tools, same_finish, "
            "same_tools, stream FROM shadow_requests WHERE group_name = 'mirrored' "
            "AND live_tools = 'lookup'").fetchall()
        return found if len(found) >= 4 else None

    found = wait_for(rows, "no paired rows with the live answer's tools")
    assert {row[6] for row in found} == {0, 1}   # JSON answers and a stream
    for live_finish, live_tools, shadow_finish, shadow_tools, same_finish, same_tools, _ in \
            found:
        assert (live_finish, shadow_finish, live_tools, shadow_tools) == (
            "tool", "tool", "lookup", "lookup")
        assert same_finish == 1 and same_tools == 1
    # Requests without tools: both stopped, no tools, the same.
    plain = sqlite3.connect(db).execute(
        "SELECT live_finish, same_finish, same_tools FROM shadow_requests "
        "WHERE group_name = 'mirrored' AND live_tools = '' AND both_answered").fetchall()
    assert plain and all(row == ("stop", 1, 1) for row in plain)
