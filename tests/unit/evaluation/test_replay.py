"""Replay end to end in one process (issue #31): synthetic logs made by the real router of
one configuration, re-decided under another by `replay`, with outcomes drawn from known
distributions: the intervals cover the candidate's true figures at their stated rate; a
replay of the logging configuration itself changes no decision; and what cannot be
evaluated is counted with its reason."""

from __future__ import annotations

import random

from sidecar.evaluation.logged import LoggedDecision
from sidecar.evaluation.replay import NO_DECISION, NO_GROUP, NO_ODDS, replay
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request

TEMPLATE = """
  g:
    strategy: {strategy}
    targets:
      - {{provider: p, model_ref: fast, weight: {fast}}}
      - {{provider: p, model_ref: cheap, weight: {cheap}}}
"""
LOGGING = config(TEMPLATE.format(strategy="weighted", fast=1, cheap=1))
CANDIDATE = config(TEMPLATE.format(strategy="weighted", fast=1, cheap=4))
# Known per-target outcome distributions: mean latency, cost and error probability.
LATENCY = {"p/fast": 500.0, "p/cheap": 2_000.0}
COST = {"p/fast": 0.004, "p/cheap": 0.001}
ERRORS = {"p/fast": 0.01, "p/cheap": 0.05}


def row(n: int, at: float, decision, chance: random.Random) -> LoggedDecision:
    target = decision.primary.label
    failed = chance.random() < ERRORS[target]
    return LoggedDecision(
        request_id=f"r{n}", at=at, group="g", caller="c", strategy=decision.strategy,
        shape={"dialect": "openai_chat", "stream": False, "tools": "none", "images": False,
               "reasoning": False, "structured_output": "none", "max_tokens_cap": "none",
               "input_size": "small"},
        complexity="simple", features=frozenset(), reasoning_effort=None,
        reasoning_budget=None, affinity="not_applicable", probe=None, selected=target,
        serving=target, status=503 if failed else 200,
        status_class="5xx" if failed else "2xx", error_class="server_error" if failed else "ok",
        latency_ms=LATENCY[target] * chance.uniform(0.5, 1.5), ttfb_ms=100.0,
        output_tokens=50, cost_usd=COST[target] * chance.uniform(0.8, 1.2),
        policy_version=decision.trace.policy_version,
        probability=decision.trace.selection[0], reason=decision.trace.selection[1],
        odds=dict(decision.trace.odds), input_tokens=10, output_budget=1024)


def log(seed: int, n: int = 300) -> list[LoggedDecision]:
    chance = random.Random(seed)
    router = Router(LOGGING)
    return [row(i, 1_000.0 + i, router.decide(request()), chance) for i in range(n)]


def test_replay_covers_the_candidates_true_figures() -> None:
    truth = {"latency_ms": 0.2 * LATENCY["p/fast"] + 0.8 * LATENCY["p/cheap"],
             "cost_usd": 0.2 * COST["p/fast"] + 0.8 * COST["p/cheap"],
             "error_rate": 0.2 * ERRORS["p/fast"] + 0.8 * ERRORS["p/cheap"]}
    logs = 120
    covered = dict.fromkeys(truth, 0)
    for seed in range(logs):
        [report] = replay(CANDIDATE, log(seed), [])
        assert report.evaluated == 300 and abs(report.changed - 0.3) < 0.01
        for name, value in truth.items():
            covered[name] += report.estimates[name].dr.covers(value)
    for name, hits in covered.items():
        assert hits >= 0.90 * logs, (name, hits / logs)


def test_replaying_the_logging_configuration_changes_no_decision() -> None:
    rows = log(5)
    [report] = replay(LOGGING, rows, [])
    assert report.changed == 0.0
    assert report.logged_versions == {rows[0].policy_version: 300}
    assert report.candidate_version == rows[0].policy_version
    for figure in ("latency_ms", "cost_usd", "error_rate"):
        found = report.estimates[figure]
        assert abs(found.ips.value - found.logged.value) < 1e-9 * max(1, found.logged.value)
        assert found.delta.covers(0.0)  # DR: the logged mean, within its noise


def test_rows_that_cannot_be_evaluated_are_counted_with_their_reason() -> None:
    rows = log(6, n=10)
    from dataclasses import replace
    rows[0] = replace(rows[0], strategy="", selected=None)       # a quota refusal
    rows[1] = replace(rows[1], probability=None)                 # logged before the odds
    other = replace(rows[2], group="gone")
    [g, gone] = replay(CANDIDATE, [*rows, other], [])
    assert gone.not_evaluated == {NO_GROUP: 1}
    assert g.not_evaluated == {NO_DECISION: 1, NO_ODDS: 1} and g.evaluated == 8
    assert g.to_dict()["not_evaluated"] == {NO_DECISION: 1, NO_ODDS: 1}


def test_a_sick_target_in_the_log_is_ejected_in_the_replay_too() -> None:
    """The replayed observation state is the live one's: a dynamic-score candidate whose
    thresholds the logged failures break stops choosing that target."""
    candidate = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: fast, weight: 1}
      - {provider: p, model_ref: cheap, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 10
        observation_window_seconds: 60
        thresholds: {max_error_rate: 0.03}
""")
    chance = random.Random(7)
    router = Router(LOGGING)
    rows = []
    for i in range(400):
        decision = router.decide(request())
        logged = row(i, 1_000.0 + i * 0.25, decision, chance)
        if logged.selected == "p/cheap":  # cheap fails half its requests in this log
            from dataclasses import replace
            failed = chance.random() < 0.5
            logged = replace(logged, status=503 if failed else 200,
                             status_class="5xx" if failed else "2xx",
                             error_class="server_error" if failed else "ok")
        rows.append(logged)
    [report] = replay(candidate, rows, [])
    assert report.candidate_shares["p/cheap"] < 0.15
    assert report.estimates["error_rate"].dr.value < report.estimates["error_rate"].logged.value
