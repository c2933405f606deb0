"""Pre-commit fallback, native streaming and cancellation through real Envoy: fake
providers with injected failures, the official SDKs as clients."""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "fallback-caller-token"
OPENAI_PROVIDERS = ("a1", "a2", "a3", "plain", "s1", "s2")
ANTHROPIC_PROVIDERS = ("c1", "c2")
KEYS = {name: f"key-{name}-secret" for name in OPENAI_PROVIDERS + ANTHROPIC_PROVIDERS}
CONFIG = """\
observations: {flush_interval_ms: 50, refresh_ms: 10}
models:
  chain:
    strategy: failover
    fallback: {per_try_timeout_seconds: 0.5}
    targets:
      - {provider: a1, model_ref: a1-model}
      - {provider: a2, model_ref: a2-model}
      - {provider: a3, model_ref: a3-model}
  two-of-three:
    strategy: failover
    fallback: {max_attempts: 2}
    targets:
      - {provider: a1, model_ref: a1-model}
      - {provider: a2, model_ref: a2-model}
      - {provider: a3, model_ref: a3-model}
  tool-chain:
    strategy: failover
    targets:
      - {provider: a1, model_ref: a1-tools, supports_tools: true}
      - {provider: plain, model_ref: no-tools, supports_tools: false}
      - {provider: a3, model_ref: a3-tools, supports_tools: true}
  stream-chain:
    strategy: failover
    targets:
      - {provider: s1, model_ref: s1-model}
      - {provider: s2, model_ref: s2-model}
  dead-first:
    strategy: failover
    targets:
      - {provider: dead, model_ref: nowhere}
      - {provider: a2, model_ref: a2-model}
  deadline-chain:
    strategy: failover
    fallback: {per_try_timeout_seconds: 0.5, deadline_seconds: 0.8}
    targets:
      - {provider: a1, model_ref: a1-model}
      - {provider: a2, model_ref: a2-model}
  sticky:
    strategy: dynamic_score
    targets:
      - {provider: a1, model_ref: a1-sticky, weight: 9}
      - {provider: a2, model_ref: a2-sticky, weight: 1}
  claude-chain:
    strategy: failover
    targets:
      - {provider: c1, model_ref: c1-model}
      - {provider: c2, model_ref: c2-model}
"""


def config_text(providers: ProviderThread, closed_port: int) -> str:
    lines = ["providers:",
             f"  dead: {{base_url: 'http://127.0.0.1:{closed_port}/v1', credential: null}}"]
    for name in OPENAI_PROVIDERS + ANTHROPIC_PROVIDERS:
        dialect = "anthropic_messages" if name in ANTHROPIC_PROVIDERS else "openai_chat"
        lines.append(f"  {name}: {{base_url: '{providers.base_url(name)}', "
                     f"credential: {{env: KEY_{name.upper()}}}, dialects: [{dialect}]}}")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    lines.append(f"callers: [{{name: team, token_sha256: {digest}}}]")
    return "\n".join(lines) + "\n" + CONFIG


class Stack:
    def __init__(self, up: UpProcess, providers: ProviderThread) -> None:
        self.up = up
        self.providers = providers
        self.openai = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        self.anthropic = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN,
                                             max_retries=0)

    def admin(self, path: str) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.up.admin_http_port}{path}", timeout=5).json()

    def figures(self, target: str) -> dict:
        return self.admin("/observations")["targets"].get(target, {"count": 0, "outcomes": {}})

    def new_outcomes(self, target: str, before: dict, count: int,
                     timeout: float = 10.0) -> dict:
        """The target's outcomes since `before` (its figures then), once `count` more
        observations arrived."""
        deadline = time.monotonic() + timeout
        while True:
            figures = self.figures(target)
            if figures["count"] >= before["count"] + count:
                return {name: n - before["outcomes"].get(name, 0)
                        for name, n in figures["outcomes"].items()
                        if n != before["outcomes"].get(name, 0)}
            assert time.monotonic() < deadline, f"{target}: {figures}"
            time.sleep(0.05)

    def received(self, name: str) -> list:
        return list(self.providers.provider(name).received)

    def sidecar_log(self) -> str:
        assert self.up.log_path is not None
        return self.up.log_path.read_text()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("fallback")
    fakes = [FakeProvider(name, api_key=KEYS[name]) for name in KEYS]
    with ProviderThread(fakes) as providers:
        (tmp / "config.yaml").write_text(config_text(providers, free_port()))
        env = {f"KEY_{name.upper()}": key for name, key in KEYS.items()}
        up = UpProcess(["--config", str(tmp / "config.yaml")], env=env,
                       log_path=tmp / "up.log")
        with up.running():
            yield Stack(up, providers)


@pytest.fixture
def fresh(stack: Stack) -> Stack:
    """Every provider healthy and with an empty request record."""
    for provider in stack.providers.server.providers.values():
        provider.behaviour = Behaviour()
        provider.received.clear()
        provider.cancelled = 0
    return stack


_unique = itertools.count()


def ask(stack: Stack, group: str, **extra) -> openai.types.chat.ChatCompletion:
    # A distinct prompt per call keeps observations per call easy to tell apart in logs.
    messages = [{"role": "user", "content": f"hello {next(_unique)}"}]
    return stack.openai.chat.completions.create(model=group, messages=messages, **extra)


def assert_served_by(stack: Stack, name: str, model_ref: str) -> None:
    (request,) = stack.received(name)
    assert request.json()["model"] == model_ref
    assert request.headers["authorization"] == f"Bearer {KEYS[name]}"
    other_keys = {key for provider, key in KEYS.items() if provider != name}
    assert not other_keys & {value.removeprefix("Bearer ") for value in request.headers.values()}
    assert not [header for header in request.headers if header.startswith("x-envoy-")]


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
    # Slow enough that all retries are in flight together, within the 0.5 s per-try timeout.
    fresh.providers.provider("a2").behaviour = Behaviour(latency_s=0.3)
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
    assert "(attempts: 2; last upstream status: 5xx)" in body["error"]["message"]


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


def arrival_gaps_ms(stack: Stack, group: str) -> list[float]:
    arrivals = []
    for _ in stack.openai.chat.completions.create(
            model=group, messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True}):
        arrivals.append(time.perf_counter())
    return [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]


def test_a_stream_after_a_fallback_still_arrives_event_by_event(fresh: Stack) -> None:
    before = fresh.figures("s1/s1-model")
    fresh.providers.provider("s1").behaviour = Behaviour(status=503)
    fresh.providers.provider("s2").behaviour = Behaviour(inter_event_delay_s=0.2)
    gaps = arrival_gaps_ms(fresh, "stream-chain")
    assert len(gaps) >= 10
    assert all(150 < gap < 300 for gap in gaps), gaps
    assert len(fresh.received("s2")) == 1
    # The failed primary is known once the stream that replaced it has ended.
    assert fresh.new_outcomes("s1/s1-model", before, 1) == {"server_error": 1}


RAW_ANTHROPIC_EVENTS = {"message_start", "content_block_start", "content_block_delta",
                        "content_block_stop", "message_delta", "message_stop"}


def test_an_anthropic_stream_after_a_fallback_arrives_event_by_event(fresh: Stack) -> None:
    fresh.providers.provider("c1").behaviour = Behaviour(status=529)
    fresh.providers.provider("c2").behaviour = Behaviour(inter_event_delay_s=0.2,
                                                         text="three short words")
    arrivals = []
    with fresh.anthropic.messages.stream(
            model="claude-chain", max_tokens=16,
            messages=[{"role": "user", "content": "hi"}]) as stream:
        for event in stream:
            if event.type in RAW_ANTHROPIC_EVENTS:  # not the SDK's derived `text` events
                arrivals.append(time.perf_counter())
        assert stream.get_final_message().model == "c2-model"
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
    assert len(gaps) >= 6
    # The SDK does not surface the `ping` event after content_block_start: one double gap.
    single = [gap for gap in gaps if 150 < gap < 300]
    double = [gap for gap in gaps if 350 < gap < 500]
    assert (len(single), len(double)) == (len(gaps) - 1, 1), gaps


def test_a_stream_that_breaks_after_its_first_event_is_not_replayed(fresh: Stack) -> None:
    before = fresh.figures("s1/s1-model")
    fresh.providers.provider("s1").behaviour = Behaviour(inter_event_delay_s=0.2,
                                                         fail_after_events=1)
    received = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for chunk in fresh.openai.chat.completions.create(
                model="stream-chain", messages=[{"role": "user", "content": "hi"}],
                stream=True):
            received.append(chunk)
    assert len(received) == 1  # the first event, then a truncated stream
    assert fresh.received("s2") == []  # no fallback after the first byte
    # Envoy sees the connection drop inside a chunked body: a reset or a protocol error.
    assert list(fresh.new_outcomes("s1/s1-model", before, 1)) in (["reset"], ["decode_error"])


def test_client_disconnects_cancel_upstream_promptly_and_leak_nothing(fresh: Stack) -> None:
    drip = fresh.providers.provider("s1")
    drip.behaviour = Behaviour(inter_event_delay_s=0.2)
    start = fresh.figures("s1/s1-model")

    def hang_up_after_the_first_event() -> None:
        with httpx.stream("POST", fresh.up.base_url + "/v1/chat/completions",
                          headers={"authorization": f"Bearer {TOKEN}"},
                          json={"model": "stream-chain", "stream": True, "messages": []},
                          timeout=10) as response:
            next(response.iter_raw())  # the first event arrived; hang up

    hang_up_after_the_first_event()
    started = time.monotonic()
    while drip.cancelled < 1:
        assert time.monotonic() - started < 1.0, "the provider never saw the disconnect"
        time.sleep(0.01)
    # Connections between Envoy and the sidecar settle in during the first few requests.
    for _ in range(9):
        hang_up_after_the_first_event()
    assert fresh.new_outcomes("s1/s1-model", start, 10) == {"client_cancel": 10}
    before = fresh.figures("s1/s1-model")
    settled = fresh.admin("/status")
    for _ in range(100):
        hang_up_after_the_first_event()
    deadline = time.monotonic() + 5
    while drip.cancelled < 110:
        assert time.monotonic() < deadline, f"only {drip.cancelled} of 110 cancelled upstream"
        time.sleep(0.05)
    assert fresh.received("s2") == []
    status = fresh.admin("/status")
    assert status["ext_proc_streams"] == 0
    assert status["asyncio_tasks"] <= settled["asyncio_tasks"] + 2, (settled, status)
    assert fresh.new_outcomes("s1/s1-model", before, 100) == {"client_cancel": 100}
