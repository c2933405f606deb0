"""The canary's guards (rollout/canary_guard.py): a breach withdraws the candidate within
one observation window, with its event logged, counted and handed to telemetry; healthy
evidence never does; what the guard holds is bounded."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from types import SimpleNamespace

import pytest

from sidecar.config.rollout import CanaryGuards
from sidecar.rollout import canary_guard
from sidecar.rollout.canary_guard import CanaryFigures, CanaryGuard, breach
from sidecar.routing.canary import CANARY, LIVE, WITHDRAWN
from sidecar.routing.router import Router
from sidecar.telemetry.results import RequestResult
from tests.unit.routing.helpers import config, request

WINDOW = 60
GROUP = f"""
  g:
    strategy: weighted
    routing_policy: {{dynamic_score: {{observation_window_seconds: {WINDOW}}}}}
    targets:
      - {{provider: p, model_ref: old}}
      - {{provider: q, model_ref: new,
         pricing: {{input_per_mtok: 1000, output_per_mtok: 1000}}}}
    rollout:
      canary:
        share_percent: 50
        targets: [q/new]
        guards: {{%s}}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(guards: str = "max_error_rate: 0.1"):
    cfg = config(GROUP % guards)
    router = Router(cfg)
    clock = Clock()
    events: list = []
    guard = CanaryGuard(lambda: router, lambda: cfg, events.append, clock=clock,
                        wall_clock=lambda: 1.7e9)
    return router, guard, clock, events


class Traffic:
    """Canary requests through the router and the guard, as the gateway and the access
    log hand them over."""

    def __init__(self, router: Router, guard: CanaryGuard) -> None:
        self.router, self.guard, self.n = router, guard, 0

    def one(self, status: int = 200, error: str = "ok", latency: float = 100.0,
            ttfb: float = 50.0, tokens: int = 10) -> str:
        while True:
            self.n += 1
            key = hashlib.sha256(str(self.n).encode()).digest()
            decision = self.router.decide(request(conversation_key=key))
            side = decision.trace.canary
            rid = f"r{self.n}"
            self.guard.decided(rid, "g", side, self.router.canary("g").version)
            if side != LIVE:
                break
        if side == CANARY:
            self.guard.finished(RequestResult(rid, status, "q/new", 1, error, latency, ttfb,
                                              tokens, tokens))
        return side


def test_an_error_burst_withdraws_the_canary_within_one_window(caplog) -> None:
    router, guard, clock, events = setup()
    traffic = Traffic(router, guard)
    start = clock.now
    for _ in range(100):             # healthy first
        traffic.one()
        clock.now += 0.5
    broke = clock.now
    caplog.set_level(logging.WARNING, "sidecar.canary")
    while traffic.one(status=503, error="server_error") == CANARY:
        clock.now += 0.5
        assert clock.now - broke < WINDOW, "not withdrawn within one window"
    assert clock.now > start
    assert router.canary("g").withdrawn
    assert traffic.one() == WITHDRAWN and traffic.one() == WITHDRAWN
    [event] = events
    assert (event.group, event.event, event.guard) == ("g", "withdrawn", "max_error_rate")
    assert event.figure > 0.1 and event.limit == 0.1
    assert event.canary_version == router.canary("g").version
    assert event.policy_version == router.live_version("g")
    assert guard.withdrawals == {("g", "max_error_rate"): 1}
    assert guard.sides[("g", WITHDRAWN)] == 3  # the one that ended the loop, and two
    [line] = [r.getMessage() for r in caplog.records if "canary_withdrawn" in r.getMessage()]
    assert '"guard":"max_error_rate"' in line and '"group":"g"' in line


def test_healthy_evidence_never_withdraws() -> None:
    router, guard, clock, events = setup("max_error_rate: 0.1, max_p95_latency_ms: 500")
    traffic = Traffic(router, guard)
    for n in range(2000):           # 5 % errors against a 10 % limit, latency in bounds
        failing = n % 20 == 0
        traffic.one(status=502 if failing else 200,
                    error="server_error" if failing else "ok", latency=400)
        clock.now += 0.2
    assert not router.canary("g").withdrawn and events == []
    figures = guard.figures()["g"]
    assert figures.requests == pytest.approx(WINDOW / 0.2, abs=1)
    assert figures.error_rate == pytest.approx(0.05, abs=0.01)


def test_errors_older_than_the_window_are_not_judged() -> None:
    router, guard, clock, _ = setup()
    traffic = Traffic(router, guard)
    for _ in range(5):               # below min_requests: nothing judged yet
        traffic.one(status=500, error="server_error")
    clock.now += WINDOW + 1
    for _ in range(40):
        traffic.one()
        clock.now += 1.0
    assert not router.canary("g").withdrawn
    assert guard.figures()["g"].errors == 0


@pytest.mark.parametrize(("guards", "request_kwargs", "breached"), [
    ("max_p95_latency_ms: 1000", {"latency": 2500}, "max_p95_latency_ms"),
    ("max_p95_ttft_ms: 800", {"ttfb": 1200}, "max_p95_ttft_ms"),
    # 20 tokens at $1,000 per million: $0.02 a request
    ("max_cost_per_request_usd: 0.01", {"tokens": 10}, "max_cost_per_request_usd"),
])
def test_each_guard_withdraws_on_its_own_figure(guards, request_kwargs, breached) -> None:
    router, guard, clock, events = setup(guards)
    traffic = Traffic(router, guard)
    for _ in range(19):
        traffic.one(**request_kwargs)
        clock.now += 1.1
    assert not router.canary("g").withdrawn     # min_requests (20) not reached yet
    traffic.one(**request_kwargs)
    assert router.canary("g").withdrawn
    assert events[0].guard == breached


def test_a_failed_attempt_a_fallback_hid_counts_against_the_canary() -> None:
    router, guard, clock, _ = setup("max_error_rate: 0.2, min_requests: 10")
    traffic = Traffic(router, guard)
    for n in range(20):
        # the transition before the request's end for some, after it for the others
        before = n % 2 == 0
        rid = f"r{traffic.n + 1}"
        if before:
            guard.fallback(SimpleNamespace(request_id=rid, error_class="server_error"))  # ignored
        side = traffic.one()
        rid = f"r{traffic.n}"
        guard.fallback(SimpleNamespace(request_id=rid, error_class="server_error"))
        clock.now += 0.1
        if side != CANARY:
            break
    assert router.canary("g").withdrawn


def test_hang_ups_and_prompts_too_long_are_not_the_candidates_failures() -> None:
    router, guard, clock, _ = setup("max_error_rate: 0.05, min_requests: 10")
    traffic = Traffic(router, guard)
    for _ in range(60):
        # Envoy logs status 0 for a caller gone before any response
        traffic.one(status=0, error="client_cancel")
        if traffic.one() == CANARY:   # its first attempt's prompt was too long there
            guard.fallback(SimpleNamespace(request_id=f"r{traffic.n}",
                                           error_class="context_window"))
        clock.now += 0.5
    assert not router.canary("g").withdrawn
    assert guard.figures()["g"].errors == 0


def test_ends_of_a_canary_a_reload_replaced_are_not_judged() -> None:
    router, guard, clock, _ = setup("max_error_rate: 0.1, min_requests: 5")
    for n in range(30):   # decided under another canary identity
        guard.decided(f"old{n}", "g", CANARY, "c-another-one")
        guard.finished(RequestResult(f"old{n}", 500, "q/new", 1, "server_error"))
        clock.now += 1.1
    assert not router.canary("g").withdrawn and "g" not in guard.figures()


def test_the_guard_judges_at_most_once_a_second() -> None:
    router, guard, clock, _ = setup("max_error_rate: 0.1, min_requests: 5")
    traffic = Traffic(router, guard)
    traffic.one()                    # judged (nothing to find)
    for _ in range(10):
        traffic.one(status=500, error="server_error")   # same instant: not judged
    assert not router.canary("g").withdrawn
    clock.now += 1.0
    traffic.one(status=500, error="server_error")
    assert router.canary("g").withdrawn


def test_what_the_guard_holds_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(canary_guard, "MAX_PENDING", 50)
    router, guard, clock, _ = setup()
    for n in range(200):             # decided, never ended (the access log lost them)
        guard.decided(f"x{n}", "g", CANARY, router.canary("g").version)
    assert len(guard._pending) == 50 and guard.dropped == 150
    clock.now += guard.max_request_s + 1
    guard.judge(force=True)
    assert len(guard._pending) == 0 and guard.dropped == 200


def test_breach_needs_min_requests_and_judges_a_rate_by_its_lower_bound() -> None:
    guards = CanaryGuards(max_error_rate=0.1, min_requests=20)
    assert breach(guards, CanaryFigures(requests=19, errors=19)) is None
    # 4 of 20 is 20 %, but its lower bound (8 %) is under the limit: not yet.
    assert breach(guards, CanaryFigures(requests=20, errors=4)) is None
    found = breach(guards, CanaryFigures(requests=20, errors=8))
    assert found is not None and found.guard == "max_error_rate" and found.figure > 0.1


def test_a_recorded_withdrawal_withdraws_a_serving_candidate_once() -> None:
    router, _, clock, _ = setup()
    asked: list[dict[str, str]] = []
    version = router.canary("g").version

    async def recorded(candidates: dict[str, str]) -> set[tuple[str, str]]:
        asked.append(dict(candidates))
        return {("g", version), ("gone", "123")}

    cfg = config(GROUP % "max_error_rate: 0.1")
    guard = CanaryGuard(lambda: router, lambda: cfg, None, recorded, clock=clock)
    asyncio.run(guard.apply_recorded())
    assert router.canary("g").withdrawn
    assert guard.withdrawals == {("g", "recorded"): 1}
    asyncio.run(guard.apply_recorded())   # nothing serving: the database is not asked
    assert asked == [{"g": version}]


def test_recorded_withdrawals_are_read_from_the_telemetry_database(tmp_path) -> None:
    from sidecar.config.service_settings import Telemetry
    from sidecar.telemetry.canary_report import recorded_withdrawals
    from sidecar.telemetry.database import open_database
    from sidecar.telemetry.rows import CanaryEventRow
    from sidecar.telemetry.store import TelemetryStore

    db = open_database(Telemetry(sqlite_path=tmp_path / "t.db"))
    store = TelemetryStore(db, replica="r1")
    store.open()
    store.write([], [], canaries=[CanaryEventRow(1.7e9, "g", "live1", "cand1", "withdrawn",
                                                 "max_error_rate", 0.3, 0.1, 20, 9)])
    assert recorded_withdrawals(db, {"g": "cand1", "h": "cand2"}) == {("g", "cand1")}
    assert recorded_withdrawals(db, {"g": "cand9"}) == set()
    assert recorded_withdrawals(db, {}) == set()
    store.close()
