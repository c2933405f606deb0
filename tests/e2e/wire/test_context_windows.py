"""Context windows (issue #27, observation 7): a target that declares
`context_window_tokens` is not sent a request that cannot fit, and a provider's
context-length 400, in any provider's shape and framing, goes to the next target before the
caller sees it; when every target refuses, the caller gets the provider's 400."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import Stack, prompt

pytestmark = pytest.mark.e2e

LONG = [{"role": "user", "content": "word " * 200}]  # ~1,000 bytes: over the fakes' 64


@pytest.mark.parametrize("name", ["openai_context_length", "vllm_context_length",
                                  "llamacpp_context_length", "sglang_context_length",
                                  "tgi_context_length", "gemini_context_length",
                                  "bedrock_context_length", "mistral_context_length",
                                  "groq_context_length", "together_context_length",
                                  "deepseek_context_length", "ollama_context_length"])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_context_length_refusal_goes_to_the_next_target(fresh: Stack, name: str,
                                                          chunked: bool) -> None:
    refusal = behaviour(name)
    refusal.chunked_json = chunked
    fresh.behave("o1", refusal)
    before = fresh.figures("o1/o1-small")
    reply = fresh.openai.chat.completions.create(model="windows", messages=LONG, max_tokens=8)
    assert reply.model == "o2-large"
    assert len(fresh.received("o1")) == 1
    short = fresh.openai.chat.completions.create(model="windows", messages=prompt(),
                                                 max_tokens=8)
    assert short.model == "o1-small"
    # The refusal is not the target's failure: no error, no fallback charged to it.
    outcomes = fresh.new_outcomes("o1/o1-small", before, 2)
    assert outcomes == {"context_window": 1, "ok": 1}
    figures = fresh.figures("o1/o1-small")
    assert figures["error_rate"] == 0 and figures["fallback_rate"] == 0


def test_an_anthropic_prompt_too_long_goes_to_the_next_target(fresh: Stack) -> None:
    fresh.behave("c1", behaviour("anthropic_context_length"))
    reply = fresh.anthropic.messages.create(model="claude-windows", max_tokens=8,
                                            messages=LONG)
    assert reply.model == "c2-large"


def test_when_no_target_can_hold_the_prompt_the_caller_gets_the_providers_400(
        fresh: Stack) -> None:
    for name in ("o1", "o2"):
        fresh.behave(name, behaviour("openai_context_length"))
    with pytest.raises(openai.BadRequestError) as raised:
        fresh.openai.chat.completions.create(model="windows", messages=LONG, max_tokens=8)
    assert raised.value.code == "context_length_exceeded"
    assert "x-sidecar-retry" not in raised.value.response.headers
    for name in ("c1", "c2"):
        fresh.behave(name, behaviour("anthropic_context_length"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        fresh.anthropic.messages.create(model="claude-windows", max_tokens=8, messages=LONG)
    assert "prompt is too long" in caught.value.message


def test_a_declared_window_keeps_a_request_that_cannot_fit_away(fresh: Stack) -> None:
    fresh.behave("o1", behaviour("openai_context_length"))  # it would refuse, were it asked
    reply = fresh.openai.chat.completions.create(model="declared-windows", messages=LONG,
                                                 max_tokens=8)
    assert reply.model == "o2-large"
    assert fresh.received("o1") == []
    fits = fresh.openai.chat.completions.create(model="declared-windows", messages=prompt(),
                                                max_tokens=8)
    assert fits.model == "o1-small"


@pytest.mark.parametrize("name", ["llamacpp_context_length", "openai_context_length",
                                  "tgi_context_length"])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_refusal_is_never_retried_on_the_same_target(fresh: Stack, name: str,
                                                       chunked: bool) -> None:
    """Issue 40, observation 8: with the documented failover options on
    (`retry_same_target: 1`, the wait for `retry-after`, the first-event commit, a
    first-token timeout), a context-length refusal goes straight to the next target: the
    order [o1, o1, o2] would have sent it to o1 again, which would refuse it again."""
    refusal = behaviour(name)
    refusal.chunked_json = chunked
    fresh.behave("o1", refusal)
    reply = fresh.openai.chat.completions.create(model="failover-options", messages=LONG,
                                                 max_tokens=8)
    assert reply.model == "o2-opts"
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (1, 1)


def test_a_refusal_by_every_target_is_answered_after_one_attempt_each(fresh: Stack) -> None:
    for name in ("o1", "o2"):
        fresh.behave(name, behaviour("llamacpp_context_length"))
    with pytest.raises(openai.BadRequestError) as raised:
        fresh.openai.chat.completions.create(model="failover-options", messages=LONG,
                                             max_tokens=8)
    assert "exceeds the available context size" in raised.value.message
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (1, 1)


def test_a_lone_target_that_refuses_is_not_asked_again(fresh: Stack) -> None:
    fresh.behave("o1", behaviour("openai_context_length"))
    with pytest.raises(openai.BadRequestError):
        fresh.openai.chat.completions.create(model="retry-same-lone", messages=LONG,
                                             max_tokens=8)
    assert len(fresh.received("o1")) == 1


def test_a_one_off_500_is_still_retried_on_the_same_target(fresh: Stack) -> None:
    """What a same-target retry is for: a failure that may not repeat."""
    fresh.behave("o1", behaviour("transient_500"))
    raw = fresh.openai.chat.completions.with_raw_response.create(model="failover-options",
                                                                 messages=prompt())
    assert raw.parse().model == "o1-opts"
    # The attempt's number is for the hold's Lua only: never the caller's.
    assert "x-sidecar-attempt" not in raw.headers
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (2, 0)


def test_an_unrecognised_refusal_is_passed_through_and_counted_by_provider(
        fresh: Stack) -> None:
    """A 400 no catalogue entry knows reaches the caller as sent (no fallback) and is
    counted for its provider on `/metrics`."""
    before = fresh.metric("sidecar_unrecognised_refusals", provider="o1")
    fresh.behave("o1", Behaviour(status=400, error_body=(
        b'{"error": {"message": "some new wording", "type": "novel_error", "code": "n1"}}')))
    with pytest.raises(openai.BadRequestError) as raised:
        fresh.openai.chat.completions.create(model="windows", messages=prompt(), max_tokens=8)
    assert raised.value.code == "n1"
    assert "x-sidecar-unrecognised" not in raised.value.response.headers
    assert fresh.received("o2") == []
    deadline = time.monotonic() + 5
    while fresh.metric("sidecar_unrecognised_refusals", provider="o1") != before + 1:
        assert time.monotonic() < deadline, "the counter did not move"
        time.sleep(0.05)
