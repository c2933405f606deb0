"""Retries that listen to the provider (issue #27, observations 3, 4 and 12): a 429's
`retry-after` (or the providers' reset headers) keeps the target out of later decisions for
that long, the caller's final 429 says when to come back, and a group may retry the same
target once on a transient failure before it falls back."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import Stack, prompt

pytestmark = pytest.mark.e2e

def waiting(stack: Stack, target: str, timeout: float = 5.0) -> float:
    """The target's remaining wait once the attempt log has brought it (admin view)."""
    deadline = time.monotonic() + timeout
    while True:
        figures = stack.figures(target)
        if figures.get("retry_after_s", 0) > 0 or time.monotonic() > deadline:
            return figures.get("retry_after_s", 0)
        time.sleep(0.02)


@pytest.mark.parametrize("name", ["openai_retry_after", "openai_rate_limited"])
def test_a_rate_limited_target_is_left_out_until_its_provider_says(fresh: Stack,
                                                                   name: str) -> None:
    """It used to be tried again by the very next decision."""
    fresh.behave("o1", behaviour(name))
    first = fresh.openai.chat.completions.create(model="rl-chain", messages=prompt())
    assert first.model == "o2-rl"
    assert 0 < waiting(fresh, "o1/o1-rl") <= 2.0
    fresh.behave("o1", Behaviour())  # healthy again, but it asked for two seconds
    for _ in range(3):
        assert fresh.openai.chat.completions.create(
            model="rl-chain", messages=prompt()).model == "o2-rl"
    assert len(fresh.received("o1")) == 1
    deadline = time.monotonic() + 5
    while fresh.figures("o1/o1-rl").get("retry_after_s", 0) > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert fresh.openai.chat.completions.create(
        model="rl-chain", messages=prompt()).model == "o1-rl"


def test_the_final_429_carries_the_providers_retry_after(fresh: Stack) -> None:
    for name in ("c1", "c2"):
        fresh.behave(name, behaviour("anthropic_rate_limited"))
    with pytest.raises(anthropic.RateLimitError) as raised:
        fresh.anthropic.messages.create(model="rl-claude", max_tokens=16,
                                        messages=prompt())
    assert raised.value.response.headers.get("retry-after") == "2"
    assert raised.value.body["error"]["type"] == "rate_limit_error"


def test_a_final_429_that_names_only_openais_reset_times_gets_a_retry_after(
        fresh: Stack) -> None:
    """OpenAI says when its windows reset (`x-ratelimit-reset-requests: 2s`,
    `...-tokens: 1s`), not `retry-after`: the caller gets the earliest as `retry-after`."""
    for name in ("o1", "o2", "o3"):
        fresh.behave(name, behaviour("openai_rate_limited"))
    with pytest.raises(openai.RateLimitError) as raised:
        fresh.openai.chat.completions.create(model="rl-chain", messages=prompt())
    assert raised.value.response.headers.get("retry-after") == "1"
    assert raised.value.type == "rate_limit_exceeded"


def test_when_every_target_waits_the_gateway_answers_429_with_the_earliest_return(
        fresh: Stack) -> None:
    for name in ("o1", "o2", "o3"):
        fresh.behave(name, behaviour("openai_retry_after"))
    with pytest.raises(openai.RateLimitError):
        fresh.openai.chat.completions.create(model="rl-chain", messages=prompt())
    for target in ("o1/o1-rl", "o2/o2-rl", "o3/o3-rl"):
        assert waiting(fresh, target) > 0
    received = sum(len(fresh.received(name)) for name in ("o1", "o2", "o3"))
    with pytest.raises(openai.RateLimitError) as raised:
        fresh.openai.chat.completions.create(model="rl-chain", messages=prompt())
    assert sum(len(fresh.received(name)) for name in ("o1", "o2", "o3")) == received
    assert raised.value.response.headers["retry-after"] in ("1", "2")
    assert "rate limited by its provider" in raised.value.message


def test_a_transient_500_is_retried_on_the_same_target_where_the_group_says_so(
        fresh: Stack) -> None:
    """`retry_same_target: 1`: the best target's one-off 500 costs a retry there, not the
    dearer or slower fallback; a group with `retry_same_target: 0` moves on at once."""
    fresh.behave("o1", behaviour("transient_500"))
    reply = fresh.openai.chat.completions.create(model="retry-same", messages=prompt())
    assert reply.model == "o1-model"
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (2, 0)
    fresh.behave("o1", behaviour("transient_500"))
    fresh.providers.provider("o1").served = 0
    assert fresh.openai.chat.completions.create(
        model="rl-chain", messages=prompt()).model == "o2-rl"


def test_with_the_defaults_a_short_wait_is_spent_on_the_same_target_never_before_the_next(
        fresh: Stack) -> None:
    """Issue 40 (defaults: retry_same_target 1, wait_for_retry_after_seconds 2): a 429
    asking for 2 s is waited out before its target is asked again; when it answers 429
    again, the next target is asked at once — the wait is Envoy's rate-limited back-off on
    a header only a same-target retry carries (it used to read `retry-after` itself, so
    the second 429 delayed the next target by 2 s more)."""
    fresh.behave("o1", behaviour("openai_retry_after"))  # 429, retry-after: 2, every time
    reply = fresh.openai.chat.completions.create(model="chain", messages=prompt())
    assert reply.model == "o2-model"
    first, second = fresh.received("o1")
    (rescue,) = fresh.received("o2")
    assert 2.0 <= second.at - first.at < 4.0  # Envoy's back-off: the wait, up to 1.5x
    assert rescue.at - second.at < 1.0  # Envoy's short back-off (at most 250 ms)
    deadline = time.monotonic() + 10  # o1's 2 s out of decisions, for the next tests
    while fresh.figures("o1/o1-model").get("retry_after_s", 0) > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_with_the_defaults_a_429_that_names_no_wait_goes_to_the_next_target_at_once(
        fresh: Stack) -> None:
    """A 429 with no `retry-after` (or a longer one than the group waits) would only be
    answered 429 again: the next target is asked without a second try at the first."""
    for named in ((), (("retry-after", "3"),)):  # none, and one longer than 2 s
        fresh.behave("o1", Behaviour(status=429, headers=named))
        fresh.providers.provider("o1").received.clear()
        assert fresh.openai.chat.completions.create(
            model="chain", messages=prompt()).model == "o2-model"
        assert len(fresh.received("o1")) == 1
    deadline = time.monotonic() + 10  # o1's 3 s out of decisions, for the next tests
    while fresh.figures("o1/o1-model").get("retry_after_s", 0) > 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_target_that_keeps_failing_gets_its_retries_then_the_fallback(fresh: Stack) -> None:
    fresh.behave("o1", Behaviour(status=500))
    reply = fresh.openai.chat.completions.create(model="retry-same", messages=prompt())
    assert reply.model == "o2-model"
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (2, 1)


def test_a_group_that_waits_for_retry_after_tries_the_same_target_once_it_is_time(
        fresh: Stack) -> None:
    """`retry_same_target: 1, wait_for_retry_after_seconds: 5`: a 429 asking for 1 s is
    waited out (Envoy's rate-limited back-off: between 1 and 1.5 s), then the same target
    answers; the fallback is never called."""
    fresh.behave("o1", Behaviour(status=429, fail_first=1, headers=(("retry-after", "1"),)))
    started = time.monotonic()
    reply = fresh.openai.chat.completions.create(model="wait-same", messages=prompt())
    took = time.monotonic() - started
    assert reply.model == "o1-wait"
    assert (len(fresh.received("o1")), len(fresh.received("o2"))) == (2, 0)
    assert 1.0 <= took < 6.0
    gap = fresh.received("o1")[1].at - fresh.received("o1")[0].at
    assert 1.0 <= gap < 2.0
