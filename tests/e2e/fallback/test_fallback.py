"""Pre-commit fallback through real Envoy: fake providers with injected failures, the
official SDKs as clients (the shared stack: conftest.py)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import anthropic
import openai
import pytest

from sidecar.devstack.providers import Behaviour
from tests.e2e.fallback.conftest import (
    KEYS,
    Stack,
    ask,
    assert_served_by,
)

pytestmark = pytest.mark.e2e


FAILURES = {
    "503": (Behaviour(status=503), "server_error"),
    "429": (Behaviour(status=429), "rate_limited"),
    "529": (Behaviour(status=529), "server_error"),
    "reset": (Behaviour(reset_connection=True), "reset"),
    "timeout before headers": (Behaviour(latency_s=1.5), "upstream_timeout"),
    "401, our key refused": (Behaviour(status=401), "provider_rejected"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_primary_falls_back_to_the_next_target(fresh: Stack, failure: str) -> None:
    behaviour, outcome = FAILURES[failure]
    before = fresh.figures("a1/a1-model")
    fresh.providers.provider("a1").behaviour = behaviour
    reply = ask(fresh, "chain")
    assert reply.model == "a2-model"
    assert len(fresh.received("a1")) == 1
    assert_served_by(fresh, "a2", "a2-model")
    assert fresh.received("a3") == []
    # The failed attempt counts against the primary, with its own error class.
    assert fresh.new_outcomes("a1/a1-model", before, 1) == {outcome: 1}


# With the defaults (issue 40): how many times the failing primary is tried before the
# next target answers. A 5xx may not repeat (one more try, `retry_same_target: 1`); a 429
# naming no wait, a reset, a timeout or a refused key goes to the next target at once.
DEFAULT_TRIES = {"503": 2, "429": 1, "529": 2, "reset": 1, "timeout before headers": 1,
                 "401, our key refused": 1}


@pytest.mark.parametrize("failure", FAILURES)
def test_the_defaults_try_the_same_target_again_only_after_a_failure_that_may_not_repeat(
        fresh: Stack, failure: str) -> None:
    behaviour, outcome = FAILURES[failure]
    before = fresh.figures("a1/a1-defaults")
    fresh.providers.provider("a1").behaviour = behaviour
    reply = ask(fresh, "defaults-chain")
    assert reply.model == "a2-defaults"
    tries = DEFAULT_TRIES[failure]
    assert len(fresh.received("a1")) == tries
    assert fresh.received("a3") == []
    assert fresh.new_outcomes("a1/a1-defaults", before, tries) == {outcome: tries}


def test_a_refused_connection_falls_back(fresh: Stack) -> None:
    before = fresh.figures("dead/nowhere")
    assert ask(fresh, "dead-first").model == "a2-model"
    assert_served_by(fresh, "a2", "a2-model")
    assert fresh.new_outcomes("dead/nowhere", before, 1) == {"connect_failure": 1}


def test_the_rescuing_target_is_credited_and_not_charged_for_the_failures(
        fresh: Stack) -> None:
    before = fresh.figures("a2/a2-model")
    fresh.providers.provider("a1").behaviour = Behaviour(latency_s=1.5)  # per-try timeout
    ask(fresh, "chain")
    assert fresh.new_outcomes("a2/a2-model", before, 1) == {"ok": 1}
    figures = fresh.figures("a2/a2-model")
    # a1's 0.5 s per-try timeout is not a2's latency or time to first byte.
    assert (figures["p95_latency_ms"] or 0) < 400, figures
    assert (figures["p95_ttfb_ms"] or 0) < 400, figures


def test_many_concurrent_failures_all_fall_back(fresh: Stack) -> None:
    """Envoy's default circuit breaker allows only 3 retries in flight per cluster."""
    fresh.providers.provider("a1").behaviour = Behaviour(status=503)
    # Slow enough that all retries are in flight together, well within the 0.5 s per-try
    # timeout even on a loaded machine.
    fresh.providers.provider("a2").behaviour = Behaviour(latency_s=0.15)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        models = list(pool.map(lambda _: ask(fresh, "chain").model, range(12)))
    assert models == ["a2-model"] * 12
    assert len(fresh.received("a2")) == 12


def test_a_two_megabyte_request_falls_back_intact(fresh: Stack) -> None:
    fresh.providers.provider("a1").behaviour = Behaviour(status=503)
    content = "y" * (2 * 1024 * 1024)
    reply = fresh.openai.chat.completions.create(
        model="chain", messages=[{"role": "user", "content": content}])
    assert reply.model == "a2-model"
    (request,) = fresh.received("a2")
    assert request.json() == {"model": "a2-model",
                              "messages": [{"role": "user", "content": content}]}


def test_callers_cannot_choose_the_request_id_that_pairs_attempts(fresh: Stack) -> None:
    ask(fresh, "chain", extra_headers={"x-request-id": "caller-chosen-id"})
    (request,) = fresh.received("a1")
    assert request.headers.get("x-request-id") != "caller-chosen-id"


def test_anthropic_overload_falls_back_with_the_fallbacks_own_key(fresh: Stack) -> None:
    fresh.providers.provider("c1").behaviour = Behaviour(status=529)
    message = fresh.anthropic.messages.create(
        model="claude-chain", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert message.model == "c2-model"
    (request,) = fresh.received("c2")
    assert request.headers["x-api-key"] == KEYS["c2"]
    assert request.json()["model"] == "c2-model"
    assert "authorization" not in request.headers


def test_two_failures_reach_the_second_fallback(fresh: Stack) -> None:
    fresh.providers.provider("a1").behaviour = Behaviour(status=500)
    fresh.providers.provider("a2").behaviour = Behaviour(status=429)
    assert ask(fresh, "chain").model == "a3-model"
    assert_served_by(fresh, "a3", "a3-model")
    expected = [("a1/a1-model", "a2/a2-model", "server_error", 1),
                ("a2/a2-model", "a3/a3-model", "rate_limited", 2)]
    # Earlier tests' transitions may still be arriving: wait for this request's two, which
    # come in attempt order, as the last two lines of the group.
    deadline = time.monotonic() + 10
    while True:
        transitions = [json.loads(line.split(" sidecar.fallback ", 1)[1])
                       for line in _lines(fresh, ' sidecar.fallback {"event":"fallback_'
                                                 'transition","group":"chain",')]
        last = [(t["from_target"], t["to_target"], t["error_class"], t["attempt"])
                for t in transitions[-2:]]
        if last == expected:
            break
        assert time.monotonic() < deadline, last
        time.sleep(0.05)
    assert set(transitions[-1]) == {"event", "group", "from_target", "to_target",
                                    "error_class", "attempt", "failed_after_ms"}
    assert all(0 <= t["failed_after_ms"] < 400 for t in transitions[-2:])


def _lines(stack: Stack, marker: str) -> list[str]:
    return [line for line in stack.sidecar_log().splitlines() if marker in line]


def test_when_every_attempt_fails_the_caller_gets_one_clear_error(fresh: Stack) -> None:
    for name in ("a1", "a2", "a3"):
        fresh.providers.provider(name).behaviour = Behaviour(status=503)
    with pytest.raises(openai.APIStatusError) as caught:
        ask(fresh, "chain")
    assert caught.value.status_code == 502
    error = caught.value.response.json()["error"]
    assert error["message"] == ("No target of this model group could serve the request "
                                "(attempts: 3; last upstream status: 5xx). Try again later.")
    assert error["code"] == "gateway_502"
    assert "injected failure" not in caught.value.response.text  # the provider's own words
    assert not any(key in caught.value.response.text for key in KEYS.values())
    assert [len(fresh.received(name)) for name in ("a1", "a2", "a3")] == [1, 1, 1]


def test_anthropic_callers_get_the_exhausted_error_in_their_dialect(fresh: Stack) -> None:
    for name in ("c1", "c2"):
        fresh.providers.provider(name).behaviour = Behaviour(status=529)
    with pytest.raises(anthropic.APIStatusError) as caught:
        fresh.anthropic.messages.create(model="claude-chain", max_tokens=16,
                                        messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502
    body = caught.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    # Two targets, three attempts: round them again (c1, c2, c1; fallback_policy.py).
    assert "(attempts: 3; last upstream status: 5xx)" in body["error"]["message"]


def test_a_final_429_stays_a_429_with_the_gateways_message(fresh: Stack) -> None:
    for name in ("a1", "a2", "a3"):
        fresh.providers.provider(name).behaviour = Behaviour(status=429)
    with pytest.raises(openai.RateLimitError) as caught:
        ask(fresh, "chain")
    assert "(attempts: 3; last upstream status: 429)" in caught.value.message
    assert caught.value.response.json()["error"]["type"] == "rate_limit_exceeded"


def test_a_refused_provider_key_is_never_blamed_on_the_caller(fresh: Stack) -> None:
    for name in ("a1", "a2", "a3"):
        fresh.providers.provider(name).behaviour = Behaviour(status=401)
    with pytest.raises(openai.APIStatusError) as caught:
        ask(fresh, "chain")
    assert caught.value.status_code == 502  # not 401: the caller's token was fine
    assert "the gateway's provider key was refused" in caught.value.message


def test_the_deadline_bounds_all_attempts_together(fresh: Stack) -> None:
    for name in ("a1", "a2"):
        fresh.providers.provider(name).behaviour = Behaviour(latency_s=0.6)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        ask(fresh, "deadline-chain")
    elapsed = time.monotonic() - started
    assert caught.value.status_code == 504
    assert 0.7 < elapsed < 1.2  # the 0.8 s deadline, not 2 × 0.5 s per try
    assert [len(fresh.received(name)) for name in ("a1", "a2")] == [1, 1]


def test_a_successful_fallback_does_not_repin_the_conversation(fresh: Stack) -> None:
    conversation = [{"role": "user", "content": "a conversation that should stay put"}]
    fresh.providers.provider("a1").behaviour = Behaviour(status=503)
    first = fresh.openai.chat.completions.create(model="sticky", messages=conversation)
    assert first.model == "a2-sticky" and len(fresh.received("a1")) == 1  # a1 was primary
    fresh.providers.provider("a1").behaviour = Behaviour()
    turn = [*conversation, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and the next turn"}]
    second = fresh.openai.chat.completions.create(model="sticky", messages=turn)
    assert second.model == "a1-sticky"  # the pin kept the initially selected primary


def test_attempts_are_bounded_by_max_attempts(fresh: Stack) -> None:
    for name in ("a1", "a2"):
        fresh.providers.provider(name).behaviour = Behaviour(status=503)
    with pytest.raises(openai.APIStatusError):
        ask(fresh, "two-of-three")
    assert [len(fresh.received(name)) for name in ("a1", "a2", "a3")] == [1, 1, 0]


def test_a_target_the_decision_excluded_is_never_tried(fresh: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    fresh.providers.provider("a1").behaviour = Behaviour(status=503)
    assert ask(fresh, "tool-chain", tools=tools).model == "a3-tools"
    fresh.providers.provider("a3").behaviour = Behaviour(status=503)
    with pytest.raises(openai.APIStatusError):
        ask(fresh, "tool-chain", tools=tools)
    assert fresh.received("plain") == []
    # Without tools the same target is eligible, and serves as the first fallback.
    assert ask(fresh, "tool-chain").model == "no-tools"


def test_a_request_error_from_the_provider_is_passed_through_not_retried(fresh: Stack) -> None:
    fresh.providers.provider("a1").behaviour = Behaviour(status=400)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(fresh, "chain")
    assert caught.value.response.json()["error"]["message"] == "injected failure"
    assert len(fresh.received("a1")) == 1
    assert fresh.received("a2") == [] and fresh.received("a3") == []


def test_after_every_failure_above_nothing_waits_to_be_paired(stack: Stack) -> None:
    """Last in this module, on purpose: resets, timeouts, refused connections, 429s, 401s,
    concurrent fallbacks and chains that ran out — each request's attempts and its own
    entry met, whatever order the two logs delivered them in, and nothing of them is held
    until the window ends (`sidecar_access_log_attempts_waiting`)."""
    import httpx

    url = f"http://127.0.0.1:{stack.up.admin_http_port}/metrics"
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(url, timeout=5).text
        waiting = next(float(line.split()[1]) for line in text.splitlines()
                       if line.startswith("sidecar_access_log_attempts_waiting "))
        if waiting == 0:
            break
        assert time.monotonic() < deadline, f"{waiting} entries still waiting"
        time.sleep(0.05)
    assert 'sidecar_access_log_entries_total{log="attempt"} 0.0' not in text
