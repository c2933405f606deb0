"""The caller's response starts only once the serving target has proven itself: a reply of
undeclared length that breaks before its end, and (where the group commits at the first
event) a stream that errors in-band, fails or is silent before its first event, go to the
next target (issue #27, observations 5, 6 and 8; docs/reply-gate.md)."""

from __future__ import annotations

import itertools
import time

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import TOKEN, Stack, prompt

pytestmark = pytest.mark.e2e


def served_model(stack: Stack, group: str) -> str:
    return stack.openai.chat.completions.create(model=group, messages=prompt()).model


def test_a_chunked_reply_with_broken_framing_goes_to_the_next_target(fresh: Stack) -> None:
    """It used to end as a 200 and a connection error, the healthy second target unused."""
    before = fresh.figures("o1/o1-model")
    fresh.behave("o1", behaviour("invalid_chunked"))
    reply = fresh.openai.chat.completions.create(model="chain", messages=prompt())
    assert reply.model == "o2-model"
    assert reply.choices[0].message.content.startswith("Hello from o2")
    assert fresh.new_outcomes("o1/o1-model", before, 1) == {"decode_error": 1}


def stream_text(stack: Stack, group: str) -> tuple[str, float]:
    started = time.monotonic()
    chunks = stack.openai.chat.completions.create(model=group, messages=prompt(), stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, time.monotonic() - started


def test_a_slow_first_token_hands_over_at_the_first_token_deadline(fresh: Stack) -> None:
    """20 s to the first event at o1 used to be waited for; the group allows 1 s."""
    before = fresh.figures("o1/o1-model")
    fresh.behave("o1", behaviour("slow_first_token"))
    text, took = stream_text(fresh, "first-event")
    assert text.startswith("Hello from o2")
    assert 1.0 <= took < 4.0  # a machine four times slower still ends far from 20 s
    assert fresh.new_outcomes("o1/o1-model", before, 1) == {"upstream_timeout": 1}


def test_a_silent_target_is_not_waited_for_twice_where_the_group_retries_a_target(
        fresh: Stack) -> None:
    """Issue 40, observation 8: with `retry_same_target: 1` (and the other documented
    options), a target silent past the first-token deadline used to be tried again before
    the next one, doubling the wait. A timeout goes to the next target."""
    fresh.behave("o1", behaviour("slow_first_token"))
    text, took = stream_text(fresh, "failover-options")
    assert text.startswith("Hello from o2")
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (1, 1)
    assert 1.0 <= took < 8.0  # 20 s at o1 is never waited for


def test_an_in_band_error_is_retried_on_the_same_target_where_the_group_says_so(
        fresh: Stack) -> None:
    """An in-band server error may not repeat: `retry_same_target: 1` tries the same
    target once more before the next (the first-event gate puts it next)."""
    fresh.behave("o1", behaviour("openai_error_in_stream"))
    text, _ = stream_text(fresh, "failover-options")
    assert text.startswith("Hello from o2")
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (2, 1)


def test_an_openai_stream_whose_first_chunk_is_an_error_goes_to_the_next_target(
        fresh: Stack) -> None:
    before = fresh.figures("o1/o1-model")
    fresh.behave("o1", behaviour("openai_error_in_stream"))
    text, _ = stream_text(fresh, "first-event")
    assert text.startswith("Hello from o2")
    assert fresh.new_outcomes("o1/o1-model", before, 1) == {"server_error": 1}


def test_anthropic_overloaded_in_the_stream_goes_to_the_next_target(fresh: Stack) -> None:
    before = fresh.figures("c1/c1-model")
    fresh.behave("c1", behaviour("anthropic_overloaded_in_stream"))
    with fresh.anthropic.messages.stream(model="claude-first-event", max_tokens=64,
                                         messages=prompt()) as stream:
        text = "".join(stream.text_stream)
    assert text.startswith("Hello from c2")
    assert fresh.new_outcomes("c1/c1-model", before, 1) == {"server_error": 1}


def test_when_every_target_errors_in_band_the_caller_gets_the_gateways_error(
        fresh: Stack) -> None:
    for name in ("c1", "c2"):
        fresh.behave(name, behaviour("anthropic_overloaded_in_stream"))
    with (pytest.raises(anthropic.APIStatusError) as raised,
          fresh.anthropic.messages.stream(model="claude-first-event", max_tokens=64,
                                          messages=prompt()) as stream):
        list(stream.text_stream)
    assert raised.value.status_code == 502
    assert raised.value.body["type"] == "error"
    assert "attempts: 3" in raised.value.body["error"]["message"]  # c1, c2, c1


def test_a_group_that_commits_at_the_headers_passes_an_in_band_error_as_sent(
        fresh: Stack) -> None:
    """With `commit_at_first_event: false` nothing holds a stream: the caller reads the
    provider's error."""
    fresh.behave("c1", behaviour("anthropic_overloaded_in_stream"))
    with (pytest.raises(anthropic.APIStatusError) as raised,
          fresh.anthropic.messages.stream(model="claude-at-headers", max_tokens=64,
                                          messages=prompt()) as stream):
        list(stream.text_stream)
    assert "Overloaded" in str(raised.value)
    assert fresh.received("c2") == []


def test_with_the_defaults_a_stream_reset_before_its_first_event_goes_to_the_next_target(
        fresh: Stack) -> None:
    """Issue 40, observation 7: a provider that sends its headers and drops the connection
    before its first event used to leave the caller a 200 and a protocol error while a
    healthy fallback existed. With the defaults (`chain` sets no fallback keys) the stream
    is committed at its first event: the reset is retried on the next target, once."""
    before = fresh.figures("o1/o1-model")
    fresh.behave("o1", Behaviour(fail_after_events=0))
    text, _ = stream_text(fresh, "chain")
    assert text.startswith("Hello from o2")
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (1, 1)
    outcomes = fresh.new_outcomes("o1/o1-model", before, 1)
    assert set(outcomes) <= {"reset", "decode_error"} and sum(outcomes.values()) == 1


def test_with_the_defaults_an_in_band_overload_first_costs_one_more_try_then_falls_back(
        fresh: Stack) -> None:
    """The default first-event commit and same-target retry (issue 40): Anthropic's
    overloaded error as a stream's first event may not repeat, so c1 is asked once more,
    then c2 answers; the caller never sees the error."""
    fresh.behave("c1", behaviour("anthropic_overloaded_in_stream"))
    with fresh.anthropic.messages.stream(model="claude-chain", max_tokens=64,
                                         messages=prompt()) as stream:
        text = "".join(stream.text_stream)
    assert text.startswith("Hello from c2")
    assert (len(fresh.received("c1")), len(fresh.received("c2"))) == (2, 1)


def test_a_committed_stream_still_arrives_event_by_event(fresh: Stack) -> None:
    """The gate steps out after the first event: later events flow at the provider's pace
    (200 ms apart there, 150–400 ms at the caller)."""
    fresh.behave("o1", Behaviour(inter_event_delay_s=0.2))
    arrivals = []
    with httpx.stream("POST", fresh.up.base_url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {TOKEN}"},
                      json={"model": "first-event", "stream": True,
                            "messages": prompt()}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(gaps) >= 5
    assert all(0.1 < gap < 0.6 for gap in gaps), gaps
    assert fresh.admin("/status")["ext_proc_streams"] == 0


def test_a_stream_cut_after_its_first_event_is_not_replayed(fresh: Stack) -> None:
    """After the first event is written there is no fallback (SPEC). (Cut before the gate
    let the first event go, the attempt is retried like any broken reply.)"""
    fresh.behave("o1", behaviour("cut_stream"))
    with pytest.raises(openai.APIConnectionError):
        stream_text(fresh, "first-event")
    assert fresh.received("o2") == []


def test_a_stalled_stream_is_cut_at_the_groups_stream_idle_timeout(fresh: Stack) -> None:
    """`stream_idle_timeout_seconds: 1`: a stream that stops sending is cut a second later
    (it was Envoy's five minutes), not replayed, and charged as a timeout."""
    before = fresh.figures("o1/o1-model")
    fresh.behave("o1", behaviour("stalled_stream"))
    started = time.monotonic()
    with pytest.raises(openai.APIConnectionError):
        stream_text(fresh, "idle-cut")
    assert 1.0 <= time.monotonic() - started < 5.0
    assert fresh.received("o2") == []
    assert fresh.new_outcomes("o1/o1-model", before, 1) == {"upstream_timeout": 1}


def test_a_slow_but_steady_stream_outlives_the_idle_timeout(fresh: Stack) -> None:
    fresh.behave("o1", Behaviour(inter_event_delay_s=0.4))
    text, took = stream_text(fresh, "idle-cut")
    assert text.startswith("Hello from o1") and took > 2.0


# --- a provider reached over HTTP/2 ---------------------------------------------------------

def test_an_http2_reply_without_a_length_is_counted_and_priced(fresh: Stack) -> None:
    """HTTP/2 has no chunked encoding: a reply of undeclared length is one without a
    content-length, which the reply gate reads as it reads a chunked one."""
    fresh.behave("h2p", Behaviour(chunked_json=True))
    before = fresh.figures("h2p/h2-model")
    reply = fresh.openai.chat.completions.create(model="h2-chain", messages=prompt())
    assert reply.model == "h2-model"
    assert fresh.new_outcomes("h2p/h2-model", before, 1) == {"ok": 1}
    assert fresh.figures("h2p/h2-model")["output_tokens_per_s"] is not None
    assert fresh.received("h2p")[0].headers["authorization"] == "Bearer key-h2p-secret"


def test_an_http2_reply_reset_mid_body_goes_to_the_next_target(fresh: Stack) -> None:
    """RST_STREAM after half the body (what an HTTP/2 load balancer sends when its backend
    dies), whether the reply declared its length or not."""
    for chunked in (False, True):
        fresh.behave("h2p", Behaviour(reset_mid_body=True, chunked_json=chunked))
        reply = fresh.openai.chat.completions.create(model="h2-chain", messages=prompt())
        assert reply.model == "o2-model"


def test_an_http2_stream_arrives_event_by_event(fresh: Stack) -> None:
    fresh.behave("h2p", Behaviour(inter_event_delay_s=0.1))
    text, took = stream_text(fresh, "h2-chain")
    assert text.startswith("Hello from h2p") and took > 0.5
