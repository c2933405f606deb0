"""`sidecar rollout check` against a gateway played by an httpx transport (no network, an
injected clock): rows read back once written, a busy or failing admin endpoint, the
preflight that sends nothing when the admin endpoint cannot serve the check."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from sidecar.config import load_config_file
from sidecar.rollout.check_run import Gateway, run
from sidecar.rollout.checklist import checklist

SPEC = load_config_file(Path(__file__).parents[2] / "fixtures" / "spec_sample.yaml")
BASETEN = "baseten/gpt-oss-120b"


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def joined(**columns):  # type: ignore[no-untyped-def]
    return {"selected_target": BASETEN, "serving_target": BASETEN, "status": 200,
            "join_kind": "joined", "complexity": "simple", "affinity": "miss_created",
            "error_class": "ok", "output_tokens": 5} | columns


def gateway(admin_answers, time: FakeTime, seen: list | None = None):  # type: ignore[no-untyped-def]
    """Chat requests answer 200; each GET /requests takes the next of `admin_answers`
    (status, rows), the last one repeating."""
    answers = list(admin_answers)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            if seen is not None:
                seen.append(request)
            return httpx.Response(200, json={"choices": []})
        assert request.url.path == "/requests"
        status, rows = answers.pop(0) if len(answers) > 1 else answers[0]
        if status != 200:
            return httpx.Response(status, json={"error": "busy"})
        return httpx.Response(200, json={"trace": request.url.params["trace"], "rows": rows})

    return Gateway("http://127.0.0.1:10000", "http://127.0.0.1:50052", ("tok-a", None),
                   row_wait_s=5.0, sleep=time.sleep, clock=time.clock,
                   transport=httpx.MockTransport(handle))


def simple_text():  # type: ignore[no-untyped-def]
    return [checklist(SPEC, "adaptive-agent", "n", second_caller=False, wait_ttl=False)[0]]


def test_a_row_is_read_once_written_through_a_busy_admin_endpoint() -> None:
    time = FakeTime()
    sent: list[httpx.Request] = []
    check = gateway([(429, None), (503, None), (200, []), (200, [joined()])], time, sent)
    (verdict,) = run(simple_text(), check)
    assert verdict.ok is True and verdict.happened.startswith("200 by baseten/gpt-oss-120b")
    assert len(time.slept) == 3  # polled until the row came
    (request,) = sent
    assert request.headers["authorization"] == "Bearer tok-a"
    traceparent = request.headers["traceparent"]
    assert traceparent.startswith("00-c4ec1157") and len(traceparent) == 55
    assert json.loads(request.content)["model"] == "adaptive-agent"


def test_an_admin_endpoint_that_stays_away_fails_the_turn_and_the_check_goes_on() -> None:
    time = FakeTime()
    two = checklist(SPEC, "adaptive-agent", "n", second_caller=False, wait_ttl=False)[:2]
    verdicts = run(two, gateway([(503, None)], time))
    assert [v.ok for v in verdicts] == [False, False]
    assert "its row could not be read: 503" in verdicts[0].happened
    assert time.now >= 10.0  # each turn waited its 5 s for the row


def test_a_row_never_written_is_said_so_and_a_refusing_admin_stops_waiting() -> None:
    time = FakeTime()
    (verdict,) = run(simple_text(), gateway([(200, [])], time))
    assert verdict.ok is False and verdict.happened.endswith("no row recorded in time")
    time = FakeTime()
    (verdict,) = run(simple_text(), gateway([(401, None)], time))
    assert verdict.ok is False and "answered 401" in verdict.happened
    assert time.slept == []


def test_the_preflight_names_what_is_wrong_before_anything_is_sent() -> None:
    time = FakeTime()
    assert gateway([(200, [])], time).preflight() is None
    assert gateway([(429, None)], time).preflight() is None  # busy is not wrong
    problem = gateway([(401, None)], time).preflight()
    assert problem is not None and "answered 401" in problem

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    away = Gateway("http://127.0.0.1:10000", "http://127.0.0.1:50052", ("t", None),
                   transport=httpx.MockTransport(refuse))
    assert "cannot reach the admin endpoint" in (away.preflight() or "")
