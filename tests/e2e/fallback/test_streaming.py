"""Native streaming and cancellation through real Envoy, with and after a fallback: events
arrive as the provider sends them, a broken stream is never replayed elsewhere, and
hang-ups cancel upstream and leave nothing behind (the shared stack: conftest.py)."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from sidecar.devstack.providers import Behaviour
from tests.e2e.fallback.conftest import (
    TOKEN,
    Stack,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def steady_provider() -> Iterator[None]:
    """The fake providers run on threads of this test process: a full collection of its
    heap (large late in a full-suite run) would hold their events back and send two at
    once. The product is measured, not the test process's collector."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def arrival_gaps_ms(stack: Stack, group: str) -> list[float]:
    arrivals = []
    for _ in stack.openai.chat.completions.create(
            model=group, messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True}):
        arrivals.append(time.perf_counter())
    return [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]


def test_a_stream_after_a_fallback_still_arrives_event_by_event(
        fresh: Stack, steady_provider: None) -> None:
    before = fresh.figures("s1/s1-model")
    fresh.providers.provider("s1").behaviour = Behaviour(status=503)
    fresh.providers.provider("s2").behaviour = Behaviour(inter_event_delay_s=0.2)
    gaps = arrival_gaps_ms(fresh, "stream-chain")
    assert len(gaps) >= 10
    # Buffered events would arrive within a few ms of each other; one event late by up to
    # ~60 ms on a loaded machine shortens the next gap to ~140 (as in the Anthropic test).
    assert all(100 < gap < 300 for gap in gaps), gaps
    assert len(fresh.received("s2")) == 1
    # The failed primary is known once the stream that replaced it has ended.
    assert fresh.new_outcomes("s1/s1-model", before, 1) == {"server_error": 1}


RAW_ANTHROPIC_EVENTS = {"message_start", "content_block_start", "content_block_delta",
                        "content_block_stop", "message_delta", "message_stop"}


def test_an_anthropic_stream_after_a_fallback_arrives_event_by_event(
        fresh: Stack, steady_provider: None) -> None:
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
    # Each event arrives on its own (nothing buffered: no two events together), about 200 ms
    # after the previous one. The SDK does not surface the `ping` event after
    # content_block_start, so one gap is double. In some full-suite runs (2 of 3 on
    # 2026-11-29, never in 14 runs of this directory alone) the last event also came
    # ~200 ms late; tolerated as one more double gap (see the #7 closing note).
    # Two events buffered together arrive within a few ms; one event late by up to ~60 ms
    # (a loaded machine, 2026-12-02) shortens the next gap to ~140 ms, which is no buffering.
    assert not [gap for gap in gaps if gap < 100], gaps
    single = [gap for gap in gaps if 100 < gap < 300]
    double = [gap for gap in gaps if 300 < gap < 500]
    assert len(single) + len(double) == len(gaps), gaps
    assert 1 <= len(double) <= 2 and gaps[1] > 350, gaps


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


def _transitions(stack: Stack, group: str) -> list[str]:
    marker = f'"event":"fallback_transition","group":"{group}",'
    return [line for line in stack.sidecar_log().splitlines() if marker in line]


def test_a_fallback_before_a_stream_the_caller_closes_at_done_is_paired_once(
        fresh: Stack) -> None:
    """The openai SDK hangs up at `[DONE]`, before the stream's end (here 0.3 s later):
    Envoy flags the request's entry with the caller's hang-up, not the attempt. The
    failure before it is still paired with the target that answered, once."""
    fresh.providers.provider("s1").behaviour = Behaviour(status=503)
    fresh.providers.provider("s2").behaviour = Behaviour(stream_end_delay_s=0.3)
    before = len(_transitions(fresh, "stream-chain"))
    chunks = list(fresh.openai.chat.completions.create(
        model="stream-chain", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert chunks and len(fresh.received("s2")) == 1
    deadline = time.monotonic() + 10
    while len(_transitions(fresh, "stream-chain")) < before + 1:
        assert time.monotonic() < deadline, "the failure was never paired"
        time.sleep(0.05)
    time.sleep(0.5)  # a second transition, were there one, would be in by now
    (line,) = _transitions(fresh, "stream-chain")[before:]
    assert '"from_target":"s1/s1-model","to_target":"s2/s2-model"' in line
    assert '"error_class":"server_error","attempt":1' in line
