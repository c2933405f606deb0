"""The console's decision ring: bounded, told how each decision ended, nothing but
labels, names and numbers (console/decision_ring.py)."""

from __future__ import annotations

from sidecar.console.decision_ring import DecisionRing
from sidecar.observe.attempts import Transition
from sidecar.telemetry.results import RequestResult
from tests.unit.routing.helpers import config, decide, refuse, request

GROUP = """
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: a, weight: 1}
      - {provider: q, model_ref: b, weight: 1}
"""


def test_bounded_newest_first_and_told_how_each_ended() -> None:
    cfg = config(GROUP)
    ring = DecisionRing(capacity=3)
    for n in range(5):
        ring.decided(f"r{n}", 100.0 + n, "team", decide(cfg, request()))
    assert len(ring) == 3 and [e.request_id for e in ring.recent()] == ["r4", "r3", "r2"]
    assert not ring.wants("r0") and ring.wants("r4")
    primary = ring.get("r4").primary
    assert ring.get("r4").outcome == "pending"
    ring.finished(RequestResult("r4", 200, primary, 1, "ok", 120.0, 30.0))
    assert ring.get("r4").outcome == "served" and ring.get("r4").latency_ms == 120.0
    other = "q/b" if primary == "p/a" else "p/a"
    ring.fallback(Transition("g", primary, other, "server_error", 1, 20.0, request_id="r3"))
    ring.finished(RequestResult("r3", 200, other, 2, "ok", 90.0, 10.0))
    assert ring.get("r3").outcome == "fallback"
    assert ring.get("r3").failed_attempts == [(primary, "server_error", other)]
    ring.finished(RequestResult("r2", 502, primary, 2, "server_error"))
    assert ring.get("r2").outcome == "failed"
    ring.finished(RequestResult("gone", 200, "p/a", 1, "ok"))  # evicted: ignored


def test_outcomes_follow_the_failure_rule_of_the_reports() -> None:
    """observe/records.request_failed: a hang-up, the caller's own 4xx and a prompt too
    long for the window are not failures; another target answering without a failure is a
    hedge, not a fallback."""
    cfg = config(GROUP)
    ring = DecisionRing()
    ends = {"cancel": RequestResult("cancel", 0, None, 1, "client_cancel"),
            "own_4xx": RequestResult("own_4xx", 400, "p/a", 1, "client_error"),
            "window": RequestResult("window", 400, "p/a", 1, "context_window"),
            "timeout": RequestResult("timeout", 504, "p/a", 1, "upstream_timeout")}
    for request_id, result in ends.items():
        ring.decided(request_id, 1.0, "team", decide(cfg, request()))
        ring.finished(result)
    assert {k: ring.get(k).outcome for k in ends} == {
        "cancel": "cancelled", "own_4xx": "served", "window": "served", "timeout": "failed"}
    ring.decided("hedge", 1.0, "team", decide(cfg, request()))
    other = "q/b" if ring.get("hedge").primary == "p/a" else "p/a"
    ring.finished(RequestResult("hedge", 200, other, 2, "ok"))
    assert ring.get("hedge").outcome == "hedged"
    ring.decided("x" * 129, 1.0, "team", decide(cfg, request()))  # longer than any UUID
    assert not ring.wants("x" * 129)


def test_a_refusal_and_the_attempts_kept_are_bounded() -> None:
    cfg = config("""
  g:
    strategy: weighted
    targets:
      - {provider: anth-only, model_ref: a}
""")
    ring = DecisionRing()
    ring.decided("r", 1.0, "team", refuse(cfg, request()))
    assert ring.get("r").outcome == "refused" and ring.get("r").refusal
    ring.decided("", 1.0, "team", refuse(cfg, request()))  # no id: nothing to join on
    assert len(ring) == 1
    for n in range(50):
        ring.fallback(Transition("g", "x/y", "x/z", "timeout", n, None, request_id="r"))
    assert len(ring.get("r").failed_attempts) == 8
