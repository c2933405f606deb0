"""Replay end to end in one process (issue #31): synthetic logs made by the real router of
one configuration, re-decided under another by `replay`, with outcomes drawn from known
distributions: the intervals cover the candidate's true figures at their stated rate; a
replay of the logging configuration itself changes no decision; and what cannot be
evaluated is counted with its reason."""

from __future__ import annotations

import random

import pytest

from sidecar.evaluation.logged import LoggedDecision, decision_of
from sidecar.evaluation.replay import (
    LOGGED_REFUSED,
    MALFORMED,
    NO_DECISION,
    NO_GROUP,
    NO_ODDS,
    replay,
)
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
        complexity="simple", features=frozenset(), scanned=False, reasoning_effort=None,
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
    rows[3] = replace(rows[3], selected=None)                    # no target was eligible
    rows[4] = replace(rows[4], shape={**rows[4].shape, "dialect": "klingon"})
    other = replace(rows[2], group="gone")
    [g, gone] = replay(CANDIDATE, [*rows, other], [])
    assert gone.not_evaluated == {NO_GROUP: 1}
    expected = {NO_DECISION: 1, NO_ODDS: 1, LOGGED_REFUSED: 1, MALFORMED: 1}
    assert g.not_evaluated == expected and g.evaluated == 6
    assert g.to_dict()["not_evaluated"] == expected


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


def test_pinned_turns_are_weighed_by_the_odds_their_pin_was_drawn_from() -> None:
    """A pinned turn is logged with probability 1 (the pin chose it); weighed so, IPS of
    the logging policy itself fell to half the logged mean on two equal targets."""
    from dataclasses import replace
    rows = [replace(r, reason="pin", probability=1.0, affinity="hit") for r in log(8)]
    [report] = replay(LOGGING, rows, [])
    latency = report.estimates["latency_ms"]
    assert latency.ips.value == pytest.approx(latency.logged.value, rel=0.05)
    assert report.changed == 0.0 and report.churn == 0.0


def test_candidate_probability_without_support_is_reported() -> None:
    """A failover log (each primary chosen with certainty) cannot say what another target
    would have done for those requests: the candidate's mass there is reported."""
    from dataclasses import replace
    rows = [replace(r, reason="declared_order", probability=1.0, odds={r.selected: 1.0})
            for r in log(9)]
    [report] = replay(CANDIDATE, rows, [])
    assert report.unsupported_mass > 0.3
    assert report.to_dict()["candidate_mass_without_support"] == report.unsupported_mass


def test_hostile_rows_are_read_as_absent_values_never_a_failure() -> None:
    row = {"request_id": "r", "started_at": 10.0, "group_name": "g", "caller": "c",
           "strategy": "weighted", "signals": 7, "request_shape": "[1, 2]",
           "complexity": None, "prompt_features": None, "reasoning_effort": None,
           "reasoning_budget_tokens": "x", "affinity": None, "probe": None,
           "selected_target": "p/fast", "serving_target": "p/fast", "status": 200,
           "status_class": "2xx", "error_class": "ok", "latency_ms": float("nan"),
           "ttfb_ms": None, "output_tokens": None, "cost_usd": True,
           "policy_version": None, "selection_probability": 0.5,
           "selection_reason": "weights", "candidate_odds": '{"p/fast": "NaN", "p/cheap": 2}',
           "estimated_input_tokens": None, "output_budget": None}
    decision = decision_of(row)
    assert decision.shape == {} and decision.odds is None and decision.latency_ms is None
    assert decision.cost_usd is None and decision.reasoning_budget is None
    [report] = replay(CANDIDATE, [decision], [])
    assert report.evaluated == 1
    assert report.estimates["latency_ms"] is None  # no finite latency to estimate from
