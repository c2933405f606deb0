"""Hedged first tokens (docs/hedging.md): the Envoy pieces, the sidecar's plan (which
decisions hedge, with what deadline and headers), the budget, and how the access log's
entries of a pair cluster become observations."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from envoy.data.accesslog.v3 import accesslog_pb2 as al

from sidecar.config import load_config_text
from sidecar.config.problems import ConfigError
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.render import render_envoy_yaml
from sidecar.gateway import Forward, Gateway, Pending, Runtime
from sidecar.gateway.hedging import Hedges
from sidecar.observe.entries import attempt_of, observation_of
from sidecar.observe.records import Outcome
from sidecar.routing.observations import ObservationSnapshot, TargetObservations
from tests.unit.test_envoy_config import envoy_validate

TOKEN = "tok-hedge"
CONFIG_TEXT = f"""
providers:
  a: {{base_url: "http://127.0.0.1:9/a/v1", credential: {{env: KEY_A}}}}
  b: {{base_url: "http://127.0.0.1:9/b/v1", credential: {{env: KEY_B}}}}
  c: {{base_url: "http://127.0.0.1:9/c/v1", dialects: [anthropic_messages],
       credential: {{env: KEY_C}}}}
callers: [{{name: t, token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]
models:
  hedged:
    strategy: failover
    targets: [{{provider: a, model_ref: ma}}, {{provider: b, model_ref: mb}},
              {{provider: c, model_ref: mc}}]
    bridges: true
    fallback: {{stream_idle_timeout_seconds: 30}}
    hedge: {{burst: 2, budget_percent: 50, min_deadline_ms: 100, max_deadline_seconds: 5}}
  plain: {{targets: [{{provider: a, model_ref: ma}}]}}
"""
CONFIG = load_config_text(CONFIG_TEXT)
ENV = {"KEY_A": "ka", "KEY_B": "kb", "KEY_C": "kc"}


def rendered() -> dict:
    return yaml.safe_load(render_envoy_yaml(CONFIG, EnvoyAddresses()))


def test_a_hedging_group_gets_pair_clusters_internal_listeners_and_a_hedging_route() -> None:
    document = rendered()
    assert document["bootstrap_extensions"][0]["name"] == "envoy.bootstrap.internal_listener"
    listeners = document["static_resources"]["listeners"]
    inner = [listener for listener in listeners if "internal_listener" in listener]
    assert [listener["name"] for listener in inner] == [
        f"target__hedged__{n}__{p}__hedge_in" for n, p in enumerate("abc")]
    clusters = {c["name"]: c for c in document["static_resources"]["clusters"]}
    pairs = sorted(name for name in clusters if name.startswith("hedge__"))
    assert pairs == sorted(f"hedge__hedged__{i}__{'abc'[i]}__{j}__{'abc'[j]}"
                           for i in range(3) for j in range(3) if i != j)
    pair = clusters["hedge__hedged__0__a__1__b"]
    assert [(e.get("priority", 0),
             e["lb_endpoints"][0]["endpoint"]["address"]["envoy_internal_address"][
                 "server_listener_name"]) for e in pair["load_assignment"]["endpoints"]] == [
        (0, "target__hedged__0__a__hedge_in"), (1, "target__hedged__1__b__hedge_in")]
    # The router's control headers never reach the internal listener's router.
    filters = json.dumps(pair["typed_extension_protocol_options"])
    assert "x-envoy-upstream-rq-per-try-timeout-ms" in filters
    assert "x-envoy-hedge-on-per-try-timeout" in filters
    # Each internal listener leads to its target's own cluster (key, TLS, hold filter).
    manager = inner[1]["filter_chains"][0]["filters"][0]["typed_config"]
    route = manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["cluster"] == "target__hedged__1__b" and route["auto_host_rewrite"]
    outer = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = outer["route_config"]["virtual_hosts"][0]["routes"]
    names = [r["match"].get("headers", [{}])[0].get("string_match", {}).get("exact")
             for r in routes]
    assert names == ["c1", "c1h", "s", "c1s", None]
    hedging = routes[1]["route"]
    assert hedging["hedge_policy"] == {"hedge_on_per_try_timeout": True}
    assert hedging["retry_policy"]["retry_priority"]["name"] == (
        "envoy.retry_priorities.previous_priorities")
    assert hedging["idle_timeout"] == "30s"
    assert all("hedge_policy" not in r["route"] and "retry_priority" not in r["route"][
        "retry_policy"] for r in routes[:1] + routes[2:])
    assert all("inline_cluster_specifier_plugin" in r["route"] for r in routes)


def test_without_hedging_nothing_of_it_is_rendered() -> None:
    config = load_config_text(CONFIG_TEXT.replace(
        "    hedge: {burst: 2, budget_percent: 50, min_deadline_ms: 100, "
        "max_deadline_seconds: 5}\n", ""))
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    # The extension is always there: a reload may turn hedging on (no new bootstrap).
    assert document["bootstrap_extensions"][0]["name"] == "envoy.bootstrap.internal_listener"
    assert len(document["static_resources"]["listeners"]) == 1
    assert not any(c["name"].startswith("hedge__")
                   for c in document["static_resources"]["clusters"])


def test_the_hedging_bootstrap_validates_with_real_envoy(tmp_path: Path) -> None:
    write_sds_files(CONFIG, tmp_path / "secrets")
    path = tmp_path / "envoy.yaml"
    path.write_text(render_envoy_yaml(CONFIG, EnvoyAddresses(
        secrets_dir=str(tmp_path / "secrets"))))
    envoy_validate(path)


@pytest.mark.parametrize("group", [
    "{targets: [{provider: a, model_ref: m}], hedge: {}}",
    "{targets: [{provider: a, model_ref: m}, {provider: b, model_ref: n}], "
    "fallback: {max_attempts: 1}, hedge: {}}",
    "{targets: [{provider: a, model_ref: m}, {provider: b, model_ref: n}], "
    "hedge: {min_deadline_ms: 3000, max_deadline_seconds: 2}}",
])
def test_hedging_needs_two_attempts_and_ordered_bounds(group: str) -> None:
    with pytest.raises(ConfigError, match="hedge"):
        load_config_text(CONFIG_TEXT + f"  other: {group}\n")


def forward(gateway: Gateway, body: dict, path: str = "/v1/chat/completions") -> Forward:
    pending = gateway.on_headers({":path": path, ":method": "POST",
                                  "authorization": f"Bearer {TOKEN}"}, end_of_stream=False)
    assert isinstance(pending, Pending)
    outcome = gateway.on_body(pending, json.dumps(body).encode())
    assert isinstance(outcome, Forward), outcome
    return outcome


CHAT = {"model": "hedged", "messages": [{"role": "user", "content": "hi"}]}


def test_a_hedged_decision_goes_to_its_pair_with_the_deadline_as_per_try_timeout() -> None:
    warm = ObservationSnapshot({"a/ma": TargetObservations(count=50, p95_ttfb_ms=800,
                                                           p50_ttfb_ms=300)})
    gateway = Gateway(Runtime(CONFIG, ENV), observations=warm)
    first = forward(gateway, CHAT)  # half a token: not yet
    assert first.attempts[:2] == ("target__hedged__0__a", "target__hedged__1__b")
    outcome = forward(gateway, CHAT)
    headers = dict(outcome.set_headers)
    assert outcome.attempts == ("hedge__hedged__0__a__1__b", "hedge__hedged__0__a__1__b")
    assert headers["x-envoy-max-retries"] == "1"
    assert headers["x-envoy-upstream-rq-per-try-timeout-ms"] == "800"
    assert headers["x-sidecar-route-class"] == "c1h"
    assert json.loads(outcome.body)["model"] == "ma"  # the primary's model first
    # The second attempt is retargeted for the pair's second target.
    route = gateway.on_attempt_headers("hedge__hedged__0__a__1__b",
                                       {":path": "/a/v1/chat/completions"})
    assert route.model_ref == "mb" and route.path == "/b/v1/chat/completions"


def test_the_deadline_is_the_p95_within_its_bounds_and_the_median_cap() -> None:
    hedges = Hedges(CONFIG)

    def deadline(**figures: float) -> int | None:
        hedges._buckets["hedged"].tokens = 2.0
        view = ObservationSnapshot({"a/ma": TargetObservations(**figures)})
        return hedges.deadline_ms("hedged", "a/ma", view)

    assert deadline(count=3, p95_ttfb_ms=800) == 5000           # too little evidence
    assert deadline(count=50, p95_ttfb_ms=800, p50_ttfb_ms=300) == 800
    assert deadline(count=50, p95_ttfb_ms=2100, p50_ttfb_ms=120) == 480  # a slow tail
    assert deadline(count=50, p95_ttfb_ms=30, p50_ttfb_ms=20) == 100     # min_deadline_ms
    assert deadline(count=50, p95_ttfb_ms=9000, p50_ttfb_ms=8000) == 5000  # max


def test_the_budget_bounds_hedges_and_single_attempts_give_their_token_back() -> None:
    hedges = Hedges(CONFIG)
    view = ObservationSnapshot({})
    # Empty to start, half a token with each decision: every other decision hedges.
    planned = [hedges.deadline_ms("hedged", "a/ma", view) for _ in range(4)]
    assert planned == [None, 5000, None, 5000]
    assert hedges.totals["hedged"].no_budget == 2
    hedges.ended("hedge__hedged__0__a__1__b", 1, "a/ma")     # answered alone: token back
    assert hedges.deadline_ms("hedged", "a/ma", view) == 5000
    hedges.ended("hedge__hedged__0__a__1__b", 2, "b/mb")     # the hedge served
    hedges.ended("hedge__hedged__0__a__1__b", 2, "a/ma")     # the primary won after all
    hedges.ended("hedge__gone__0__a__1__b", 1, None)   # a pair before a reload
    tally = hedges.totals["hedged"]
    assert (tally.hedged, tally.fired, tally.second_won) == (3, 2, 1)
    # Unspent budget piles up to the burst (2), no further.
    for _ in range(10):
        hedges.ended("hedge__hedged__0__a__1__b", 1, "a/ma")
    assert hedges._buckets["hedged"].tokens == 2.0


def test_no_hedge_for_one_target_or_a_bridged_target() -> None:
    gateway = Gateway(Runtime(CONFIG, ENV))
    # An Anthropic caller: `a` and `b` are reached through bridges, only `c` natively.
    outcome = forward(gateway, {"model": "hedged", "max_tokens": 10,
                                "messages": [{"role": "user", "content": "hi"}]},
                      path="/v1/messages")
    assert not outcome.attempts[0].startswith("hedge__")
    assert "x-sidecar-route-class" not in dict(outcome.set_headers) or dict(
        outcome.set_headers)["x-sidecar-route-class"] == "c1"
    assert gateway.hedges.totals["hedged"].decisions == 0


def pair_entry(status: int, listener: str, attempts: int = 1,
               **flags: bool) -> al.HTTPAccessLogEntry:
    message = al.HTTPAccessLogEntry()
    common = message.common_properties
    common.upstream_cluster = "hedge__hedged__0__a__1__b"
    common.upstream_remote_address.envoy_internal_address.server_listener_name = listener
    common.upstream_request_attempt_count = attempts
    common.duration.FromMilliseconds(800)
    common.time_to_first_upstream_tx_byte.FromMilliseconds(1)
    common.time_to_first_upstream_rx_byte.FromMilliseconds(900)
    common.time_to_last_upstream_rx_byte.FromMilliseconds(950)
    for name, value in flags.items():
        setattr(common.response_flags, name, value)
    message.request.request_id = "r1"
    message.response.response_code.value = status
    return message


def test_a_pair_clusters_entries_name_the_target_that_served_and_losers_are_no_failures(
        ) -> None:
    runtime = Runtime(CONFIG, ENV)
    targets, groups = runtime.cluster_targets, runtime.cluster_groups
    served = observation_of(pair_entry(200, "target__hedged__1__b__hedge_in", attempts=2),
                            targets)
    assert served.target == "b/mb" and served.outcome is Outcome.OK
    # The primary, cancelled when the hedge answered: its per-try timeout was the hedge.
    loser = attempt_of(pair_entry(0, "target__hedged__0__a__hedge_in",
                                  upstream_request_timeout=True), targets, groups)
    assert loser.target == "a/ma" and loser.outcome is Outcome.HEDGED_OUT
    assert loser.group == "hedged" and loser.duration_ms == pytest.approx(800)
    # The primary answering after the hedge started is an answer, not a timeout.
    late = attempt_of(pair_entry(200, "target__hedged__0__a__hedge_in",
                                 upstream_request_timeout=True), targets, groups)
    assert late.outcome is Outcome.OK
    # The hedge cancelled because the primary won.
    cancelled = attempt_of(pair_entry(0, "target__hedged__1__b__hedge_in"), targets, groups)
    assert cancelled.target == "b/mb" and cancelled.outcome is Outcome.HEDGED_OUT
    assert cancelled.duration_ms is None  # its wait was cut short: no lower bound
    failed = attempt_of(pair_entry(503, "target__hedged__0__a__hedge_in"), targets, groups)
    assert failed.outcome is Outcome.SERVER_ERROR


def test_a_hedged_out_primary_gives_a_time_figure_and_counts_in_no_rate() -> None:
    from sidecar.observe.records import Observation
    from sidecar.observe.store import ObservationStore

    store = ObservationStore(clock=lambda: 100.0)
    store.record(Observation("a/ma", Outcome.OK, latency_ms=100, ttfb_ms=100))
    store.record(Observation("a/ma", Outcome.HEDGED_OUT, ttfb_ms=900))
    figures = store.get("a/ma", 600)
    assert figures.count == 1 and figures.error_rate == 0.0
    assert figures.p95_ttfb_ms >= 800


def test_the_deadline_never_waits_longer_than_fallback_would() -> None:
    config = load_config_text(CONFIG_TEXT.replace(
        "fallback: {stream_idle_timeout_seconds: 30}",
        "fallback: {stream_idle_timeout_seconds: 30, per_try_timeout_seconds: 4, "
        "commit_at_first_event: true, first_token_timeout_seconds: 2}"))
    hedges = Hedges(config)
    view = ObservationSnapshot({})
    hedges._buckets["hedged"].tokens = 2.0
    assert hedges.deadline_ms("hedged", "a/ma", view, stream=True) == 2000
    assert hedges.deadline_ms("hedged", "a/ma", view, stream=False) == 4000


def test_a_reload_keeps_the_budget_of_an_unchanged_hedging_group() -> None:
    hedges = Hedges(CONFIG)
    hedges._buckets["hedged"].tokens = 1.5
    hedges.totals["hedged"].hedged = 7
    kept = Hedges(CONFIG, previous=hedges)
    assert kept._buckets["hedged"].tokens == 1.5 and kept.totals["hedged"].hedged == 7
    changed = Hedges(load_config_text(CONFIG_TEXT.replace("burst: 2", "burst: 3")),
                     previous=hedges)
    assert changed._buckets["hedged"].tokens == 0.0


def test_hedging_needs_observations() -> None:
    with pytest.raises(ConfigError, match="needs observations"):
        load_config_text(CONFIG_TEXT + "observations: {enabled: false}\n")
