"""`budget_pressure` (issue #31): the share of a caller's daily spend budget used, from
quota accounting, as a bounded score input that score terms can multiply into price, so
spending leans on cheaper targets as the budget runs down; the hard quota stays the
backstop."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError
from sidecar.quotas.counters import QuotaCounters
from sidecar.routing.router import Router
from tests.clock import ManualClock
from tests.unit.routing.helpers import config, request, snapshot, warm

MIDNIGHT = 1_767_225_600.0
CONFIG = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: dear, weight: 1,
         pricing: {input_per_mtok: 10, output_per_mtok: 40}}
      - {provider: p, model_ref: cheap, weight: 1,
         pricing: {input_per_mtok: 1, output_per_mtok: 4}}
    routing_policy:
      dynamic_score:
        min_observations: 5
        affinity: {enabled: false}
        score_terms:
          - name: fast_unless_the_budget_is_low
            expression: "0.6 * latency_score * (1 - budget_pressure)
                         + 0.6 * cost_score * budget_pressure"
callers:
  - name: team
    token_sha256: "%s"
    quotas:
      spend_per_day_usd: 10
      per_group:
        g: {spend_per_day_usd: 4}
  - {name: free, token_sha256: "%s"}
""" % ("a" * 64, "b" * 64))
# The dear target is the faster one.
VIEW = snapshot(p__dear=warm(p95_latency_ms=400), p__cheap=warm(p95_latency_ms=1_600))


def test_pressure_is_the_largest_share_of_a_spend_budget_used() -> None:
    clock = ManualClock(MIDNIGHT + 3_600)
    quotas = QuotaCounters(CONFIG, clock)
    assert quotas.spend_pressure("team", "g") == 0.0
    quotas.used("team", "g", 0, 1.0, clock.now)       # 1 of 10 overall, 1 of 4 in g
    assert quotas.spend_pressure("team", "g") == 0.25
    assert quotas.spend_pressure("team", "other") == 0.1
    quotas.used("team", "g", 0, 2.99, clock.now)
    assert quotas.spend_pressure("team", "g") == 0.99  # steps of 0.01, rounded down
    quotas.used("team", "g", 0, 5.0, clock.now)
    assert quotas.spend_pressure("team", "g") == 1.0   # bounded
    assert quotas.spend_pressure("free", "g") == 0.0   # no spend budget: no pressure
    clock.now = MIDNIGHT + 86_400                        # a new day
    assert quotas.spend_pressure("team", "g") == 0.0


def shares(pressure: float) -> dict[str, float]:
    decision = Router(CONFIG).decide(request(caller="team", budget_pressure=pressure), VIEW)
    return dict(decision.trace.odds)


def test_spending_moves_to_the_cheaper_target_as_the_budget_runs_down() -> None:
    by_pressure = [shares(p)["p/cheap"] for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert by_pressure == sorted(by_pressure) and by_pressure[0] < 0.2 < 0.8 < by_pressure[-1]
    rows = Router(CONFIG).decide(request(caller="team", budget_pressure=0.5), VIEW).trace
    assert {c.scores["budget_pressure"] for c in rows.candidates} == {0.5}


def test_budget_pressure_is_a_known_score_name_and_others_are_not() -> None:
    with pytest.raises(ConfigError, match="budget_pressures"):
        config("""
  g:
    strategy: dynamic_score
    targets: [{provider: p, model_ref: a}]
    routing_policy:
      dynamic_score:
        score_terms: [{name: t, expression: "budget_pressures"}]
""")
