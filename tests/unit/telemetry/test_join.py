"""The telemetry join (docs/telemetry.md §1) and the rows it writes: real routing decisions
from the SPEC-shaped core, outcomes as the access log reports them, an injected clock."""

from __future__ import annotations

import hashlib
import json
import marshal
from dataclasses import asdict

from sidecar.config.models import Pricing
from sidecar.routing.decision import Decision
from sidecar.routing.router import Router
from sidecar.telemetry.join import Joiner
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import (
    DecisionFacts,
    DecisionRecord,
    JoinedRequest,
    RequestRow,
    decision_record,
    request_row,
)
from tests.unit.routing.helpers import config, request, snapshot, warm

GROUP = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 60, pricing: {input_per_mtok: 1, output_per_mtok: 4}}
      - {provider: p, model_ref: b, weight: 40, honors_max_tokens: false}
    routing_policy:
      dynamic_score:
        min_observations: 10
        score_terms:
          - {name: quick, expression: "latency_score"}
""")
PRICES = {"p/a": Pricing(input_per_mtok=1, output_per_mtok=4).rates}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def facts(request_id: str, **fields) -> DecisionRecord:
    """A real decision, as the telemetry worker receives it: through marshal."""
    outcome = Router(GROUP).decide(request(**fields), snapshot(p__a=warm(50, p95_latency_ms=100),
                                                              p__b=warm(50, p95_latency_ms=900)))
    assert isinstance(outcome, Decision)
    sent = decision_record(DecisionFacts(request_id, 1_700_000_000.0, "team-a", "g", outcome))
    return DecisionRecord(*marshal.loads(marshal.dumps(sent)))


def result(request_id: str, **fields) -> RequestResult:
    values = {"status": 200, "serving_target": "p/a", "attempts": 1, "error_class": "ok",
              "latency_ms": 420.0, "ttfb_ms": 80.0, "input_tokens": 1000, "output_tokens": 500,
              "cached_tokens": 200} | fields
    return RequestResult(request_id, **values)


def joiner(**kw) -> tuple[Joiner, list[RequestRow], Clock]:
    rows: list[RequestRow] = []
    clock = Clock()

    def build(item: JoinedRequest) -> None:
        rows.append(request_row(item.record, item.result, PRICES, item.join, item.at))

    return Joiner(build, clock=clock,
                  wall_clock=lambda: 1_700_000_500.0, **kw), rows, clock


def test_a_decision_and_its_outcome_make_one_row_with_buckets_usage_and_cost() -> None:
    join, rows, _ = joiner()
    join.decided(facts("r1", max_tokens_cap=64))
    assert rows == [] and len(join) == 1
    join.finished(result("r1"))
    (row,) = rows
    assert (row.request_id, row.caller, row.group, row.strategy, row.join) == (
        "r1", "team-a", "g", "dynamic_score", "joined")
    assert (row.selected_target, row.serving_target, row.status_class) == ("p/a", "p/a", "2xx")
    assert row.max_tokens_filtered and row.max_tokens_bucket == row.request_shape["max_tokens_cap"]
    assert row.exclusions == (
        "p/b:hard_filters.require_honors_max_tokens_when_caller_capped")
    assert row.cost_usd == (1000 * 1 + 500 * 4) / 1e6
    assert (row.input_tokens, row.output_tokens, row.cached_tokens) == (1000, 500, 200)
    assert row.final_share_bucket == "0.8-1.0" and row.candidate_count == 1
    assert len(join) == 0


def test_a_target_removed_for_the_cap_counts_with_the_hard_filter_off_too() -> None:
    """Issue 42: with the hard filter off, the baseline rule still removes a target that
    ignores a caller's cap; `max_tokens_filtered` must say so (it said "no")."""
    for strategy, policy in (("dynamic_score", """
    routing_policy:
      dynamic_score:
        min_observations: 10
        hard_filters: {require_honors_max_tokens_when_caller_capped: false}
        score_terms:
          - {name: quick, expression: "latency_score"}"""), ("weighted", "")):
        group = config(f"""
  g:
    strategy: {strategy}
    targets:
      - {{provider: p, model_ref: a, weight: 60}}
      - {{provider: p, model_ref: b, weight: 40, honors_max_tokens: false}}{policy}
""")
        for cap, removed in ((64, True), (None, False)):
            outcome = Router(group).decide(request(max_tokens_cap=cap),
                                           snapshot(p__a=warm(50), p__b=warm(50)))
            assert isinstance(outcome, Decision)
            sent = decision_record(DecisionFacts("r", 1_700_000_000.0, "team-a", "g", outcome))
            row = request_row(DecisionRecord(*marshal.loads(marshal.dumps(sent))),
                              result("r"), PRICES, "joined", 1_700_000_001.0)
            assert row.max_tokens_filtered is removed, (strategy, cap)
            assert ("eligibility.honors_max_tokens" in row.exclusions) is removed


def test_an_unpriced_target_has_no_cost_and_an_outcome_without_decision_is_log_only() -> None:
    join, rows, _ = joiner()
    join.finished(result("nobody-decided", serving_target="p/b", status=503,
                         error_class="server_error"))
    (row,) = rows
    assert (row.join, row.cost_usd, row.status_class, row.caller) == (
        "log_only", None, "5xx", "")
    assert row.started_at == 1_700_000_500.0 and join.log_only == 1


def test_pending_decisions_are_bounded_by_count_and_by_age() -> None:
    join, rows, clock = joiner(max_pending=2, max_age_s=60)
    join.decided(facts("r1"))
    clock.now += 30
    join.decided(facts("r2"))  # at 130 s
    clock.now += 20
    join.decided(facts("r3"))  # full: the oldest is written without its outcome
    assert [(r.request_id, r.join) for r in rows] == [("r1", "evicted")]
    clock.now += 45
    join.sweep()               # r2 is 65 s old, r3 45 s
    assert [(r.request_id, r.join) for r in rows[1:]] == [("r2", "decision_only")]
    assert rows[1].status_class == "unknown" and rows[1].cost_usd is None
    join.finished(result("r3"))
    assert rows[-1].join == "joined" and len(join) == 0
    assert (join.evicted, join.expired) == (1, 1)


def test_an_id_decided_twice_is_a_collision_not_one_request() -> None:
    join, rows, _ = joiner()
    join.decided(facts("same"))
    join.decided(facts("same"))
    join.finished(result("same"))
    assert [r.join for r in rows] == ["duplicate_id", "joined"] and join.duplicates == 1


def test_rows_hold_no_prompt_text_or_token_digest() -> None:
    secret = "CANARY-PROMPT-7f3a"
    join, rows, _ = joiner()
    join.decided(facts("r1", prompt_chars=len(secret)))
    join.finished(result("r1"))
    text = json.dumps(asdict(rows[0]), default=str)
    assert secret not in text and hashlib.sha256(secret.encode()).hexdigest() not in text
