"""Usage is never left to the caller's choice (issue #28, observation 1): an OpenAI Chat
stream without `stream_options.include_usage` is asked for its usage upstream, counted in
quotas, rows and windows, and the caller's stream is what it would have been without the
gateway: no usage chunk, no `"usage": null`."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import STREAM_QUOTA_TOKEN, TOKEN, Stack, prompt

pytestmark = pytest.mark.e2e


def raw_stream(stack: Stack, group: str, token: str = TOKEN, **extra) -> list[dict | str]:
    with httpx.stream("POST", stack.up.base_url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {token}"},
                      json={"model": group, "messages": prompt(), "stream": True,
                            **extra}) as response:
        assert response.status_code == 200
        text = response.read().decode()
    events = [event.removeprefix("data: ") for event in text.split("\n\n") if event]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


@pytest.mark.parametrize("group", ["priced", "bridged-claude"])
def test_the_caller_sees_no_usage_it_did_not_ask_for_and_the_row_has_it(
        fresh: Stack, group: str) -> None:
    started = time.time()
    events = raw_stream(fresh, group)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("usage" not in chunk for chunk in chunks), chunks
    assert all(chunk["choices"] for chunk in chunks)  # no empty-choices usage chunk
    row = fresh.row(group, started)
    assert row["output_tokens"] and row["output_tokens"] > 0
    assert row["input_tokens"] and row["input_tokens"] > 0
    if group == "priced":
        asked = fresh.received("o1")[-1].json()
        assert asked["stream_options"] == {"include_usage": True}


def test_a_caller_that_asks_for_usage_gets_it_as_the_provider_sends_it(fresh: Stack) -> None:
    events = raw_stream(fresh, "priced", stream_options={"include_usage": True})
    usage = [chunk for chunk in events[:-1] if chunk["choices"] == []]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] > 0
    assert all(chunk.get("usage", "absent") is None for chunk in events[:-1]
               if chunk["choices"])


def test_the_sdk_streams_the_readme_way_without_an_empty_choices_chunk(fresh: Stack) -> None:
    """`chunk.choices[0]` on every chunk, as the README does: an unasked usage chunk (empty
    choices) would raise IndexError."""
    text = "".join(chunk.choices[0].delta.content or "" for chunk in
                   fresh.openai.chat.completions.create(model="priced", messages=prompt(),
                                                        stream=True))
    assert text.startswith("Hello from o1")


def test_a_token_quota_cannot_be_streamed_around(fresh: Stack) -> None:
    """Eight streams of 20-odd tokens under a 100-token daily limit were all served; the
    same as JSON were refused on the sixth."""
    client = openai.OpenAI(base_url=fresh.up.base_url + "/v1", api_key=STREAM_QUOTA_TOKEN,
                           max_retries=0)
    fresh.behave("o1", Behaviour(text="one two three four five six seven eight nine ten "
                                      "eleven twelve thirteen fourteen fifteen sixteen"))
    served = 0
    for _ in range(10):
        before = fresh.figures("o1/o1-model")
        try:
            list(client.chat.completions.create(model="priced", messages=prompt(),
                                                stream=True))
        except openai.RateLimitError as refused:
            assert "tokens_per_day" in refused.message
            break
        served += 1
        # The ledger counts a stream when its access-log entry arrives, as the observations.
        fresh.new_outcomes("o1/o1-model", before, 1)
    assert 1 <= served <= 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_without_readable_usage_is_charged_an_estimate_not_nothing(
        fresh: Stack, stream: bool) -> None:
    """The row says so (`usage_source: estimated`): the request's estimated input and its
    output budget (here its cap, 40) as tokens, and their cost."""
    from sidecar.devstack.provider_behaviours import behaviour

    fresh.behave("o1", behaviour("no_usage"))
    started = time.time()
    reply = fresh.openai.chat.completions.create(model="priced", messages=prompt(),
                                                 max_tokens=40, stream=stream)
    if stream:
        list(reply)
    else:
        assert reply.usage is None
    row = fresh.row("priced", started)
    assert row["usage_source"] == "estimated"
    assert row["output_tokens"] == 40 and row["input_tokens"] > 0
    assert row["cost_usd"] == pytest.approx(
        (row["input_tokens"] * 1.25 + 40 * 10) / 1e6)
    fresh.behave("o1", Behaviour())
    started = time.time()
    fresh.openai.chat.completions.create(model="priced", messages=prompt())
    assert fresh.row("priced", started)["usage_source"] == "reported"


def test_a_synthesized_responses_stream_reports_its_usage(fresh: Stack) -> None:
    """A Responses stream says its usage in `response.completed`, under `response`."""
    started = time.time()
    with fresh.openai.responses.stream(model="bridged-claude", input="hello") as events:
        final = events.get_final_response()
    row = fresh.row("bridged-claude", started)
    assert row["usage_source"] == "reported"
    assert row["output_tokens"] == final.usage.output_tokens


def test_a_stream_of_declared_length_is_edited_without_leaving_the_caller_waiting(
        fresh: Stack) -> None:
    """A stream sent whole with a content-length (as a buffering proxy in front of a
    provider sends it): the edited stream is shorter, and with the provider's length kept
    the caller waited for bytes that never came. An unfinished last event is dropped, as
    every SSE parser drops it."""
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    events = [{"id": "x", "choices": [{"index": 0, "delta": {"content": "Hi"}}], "usage": None},
              {"id": "x", "choices": [], "usage": usage}]
    raw = "".join(f"data: {json.dumps(event, separators=(',', ':'))}\n\n" for event in events)
    fresh.behave("o1", Behaviour(raw_body=(raw + "data: [DONE]\n\ndata: {\"cut").encode(),
                                 content_type="text/event-stream"))
    started = time.time()
    with httpx.stream("POST", fresh.up.base_url + "/v1/chat/completions", timeout=10,
                      headers={"authorization": f"Bearer {TOKEN}"},
                      json={"model": "priced", "messages": prompt(), "stream": True}) as reply:
        assert reply.status_code == 200
        body = reply.read().decode()
    assert body == ('data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
                    "data: [DONE]\n\n")
    row = fresh.row("priced", started)
    assert (row["input_tokens"], row["output_tokens"]) == (9, 3)
