"""Usage, tokens and cost for every reply the caller received, whatever its framing, priced
as providers bill prompt caching (issue #27, observations 1 and 2; docs/observations.md,
docs/configuration.md "Pricing")."""

from __future__ import annotations

import time

import httpx
import pytest

from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import TOKEN, Stack, prompt

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_json_reply_is_counted_and_priced_whatever_its_framing(fresh: Stack,
                                                                 framing: str) -> None:
    """A chunked reply used to leave the row at 0 tokens and no cost, and the window
    without a throughput figure."""
    fresh.behave("o1", Behaviour(chunked_json=framing == "chunked"))
    before = fresh.figures("o1/o1-model")
    started = time.time()
    reply = fresh.openai.chat.completions.create(model="priced", messages=prompt())
    row = fresh.row("priced", started)
    assert (row["input_tokens"], row["output_tokens"]) == (
        reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert row["cost_usd"] == pytest.approx(
        (reply.usage.prompt_tokens * 1.25 + reply.usage.completion_tokens * 10) / 1e6)
    assert fresh.new_outcomes("o1/o1-model", before, 1) == {"ok": 1}
    assert fresh.figures("o1/o1-model")["output_tokens_per_s"] is not None


def test_openai_cached_tokens_are_priced_at_the_cache_price(fresh: Stack) -> None:
    fresh.behave("o1", behaviour("openai_cached_usage"))
    started = time.time()
    reply = fresh.openai.chat.completions.create(model="priced", messages=prompt())
    usage = reply.usage
    assert usage.prompt_tokens_details.cached_tokens == 1024
    row = fresh.row("priced", started)
    assert (row["input_tokens"], row["cached_tokens"]) == (usage.prompt_tokens, 1024)
    assert row["cost_usd"] == pytest.approx(
        ((usage.prompt_tokens - 1024) * 1.25 + 1024 * 0.125
         + usage.completion_tokens * 10) / 1e6)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_cache_reads_and_writes_are_priced_beside_the_input(fresh: Stack,
                                                                      stream: bool) -> None:
    fresh.behave("c1", behaviour("anthropic_cache_usage"))
    started = time.time()
    if stream:
        with fresh.anthropic.messages.stream(model="priced-claude", max_tokens=64,
                                             messages=prompt()) as events:
            usage = events.get_final_message().usage
    else:
        usage = fresh.anthropic.messages.create(model="priced-claude", max_tokens=64,
                                                messages=prompt()).usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (1024, 256)
    row = fresh.row("priced-claude", started)
    whole_input = usage.input_tokens + 1024 + 256
    assert (row["input_tokens"], row["cached_tokens"], row["cache_write_tokens"]) == (
        whole_input, 1024, 256)
    assert row["cost_usd"] == pytest.approx(
        (usage.input_tokens * 3 + 1024 * 0.3 + 256 * 3.75 + usage.output_tokens * 15) / 1e6)


def test_a_garbage_event_inside_an_anthropic_stream_is_not_counted_ok(fresh: Stack) -> None:
    """Issue #27, observation 13: an event the provider garbled is charged to the target as
    `invalid_response` (Envoy's parser flags an event that is not JSON; for OpenAI streams it
    cannot, as their `data: [DONE]` is not JSON either: docs/observations.md)."""
    before = fresh.figures("c1/c1-model")
    fresh.behave("c1", behaviour("garbage_event"))
    with httpx.stream("POST", fresh.up.base_url + "/v1/messages", timeout=30,
                      headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
                      json={"model": "priced-claude", "max_tokens": 64, "stream": True,
                            "messages": prompt()}) as response:
        assert b"data: {not json at all" in response.read()
    assert fresh.new_outcomes("c1/c1-model", before, 1) == {"invalid_response": 1}
    fresh.behave("c1", Behaviour())
    with fresh.anthropic.messages.stream(model="priced-claude", max_tokens=64,
                                         messages=prompt()) as stream:
        list(stream.text_stream)
    assert fresh.new_outcomes("c1/c1-model", before, 2) == {"invalid_response": 1, "ok": 1}


def test_an_openai_stream_ending_in_done_is_counted_ok(fresh: Stack) -> None:
    before = fresh.figures("o1/o1-model")
    list(fresh.openai.chat.completions.create(model="priced", messages=prompt(), stream=True))
    assert fresh.new_outcomes("o1/o1-model", before, 1) == {"ok": 1}


def test_a_daily_token_quota_counts_chunked_replies(fresh: Stack) -> None:
    """Chunked replies used to cost a caller's quota nothing: eight of 20-odd tokens each
    were all served under a 100-token daily limit."""
    import openai

    from tests.e2e.wire.conftest import QUOTA_TOKEN

    fresh.behave("o1", Behaviour(chunked_json=True))
    client = openai.OpenAI(base_url=fresh.up.base_url + "/v1", api_key=QUOTA_TOKEN,
                           max_retries=0)
    served = 0
    for _ in range(10):
        before = fresh.figures("o1/o1-model")
        try:
            reply = client.chat.completions.create(model="priced", messages=prompt())
        except openai.RateLimitError as refused:
            assert "tokens_per_day" in refused.message
            break
        served += 1
        assert reply.usage.total_tokens >= 20
        # The ledger counts a reply when its access-log entry arrives, as the observations.
        fresh.new_outcomes("o1/o1-model", before, 1)
    assert 1 <= served <= 5


def test_a_chunked_cache_miss_is_counted_and_its_hit_is_not(fresh: Stack) -> None:
    """A response-cache group's misses pass a sidecar filter that holds them whole: a
    chunked one is given its length there, so Envoy reads its usage as for any other."""
    fresh.behave("o3", Behaviour(chunked_json=True))
    messages = prompt()
    started = time.time()
    reply = fresh.openai.chat.completions.create(model="cached", messages=messages)
    row = fresh.row("cached", started)
    assert row["cache"] == "miss"
    assert (row["input_tokens"], row["output_tokens"]) == (
        reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert row["cost_usd"] is not None and row["cost_usd"] > 0
