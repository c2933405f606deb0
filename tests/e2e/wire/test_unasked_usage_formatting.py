"""The unasked usage chunk, whatever the provider's JSON formatting (issue #40, observations
5 and 6), through real Envoy with the official OpenAI SDK.

A provider that writes its JSON as Python's `json.dumps` does by default (`"choices": []`,
`"usage": {`) leaked the usage chunk the gateway had asked for on the caller's behalf (the
strip matched compact bytes only), and llama.cpp's `timings`, which it moves onto the usage
chunk when usage is asked, were lost with the stripped chunk. The caller's stream must be
what the provider sends a caller that does not ask: the same events, byte for byte, but
the final chunk, which carries the usage chunk's extra members (JSON-equal to the
provider's own final chunk); the row still has the reported usage."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sidecar.devstack import provider_wire
from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import Stack, prompt

pytestmark = pytest.mark.e2e

BEHAVIOURS = {
    "python_spaced_json": behaviour("python_spaced_json"),
    "llama_cpp_timings": behaviour("llama_cpp_timings"),
    "spaced_with_timings": Behaviour(spaced_json=True, engine_timings=True),
}


def events_of(body: bytes) -> list[bytes]:
    """The data of each event (the fake and the gateway write `data: …` and LF line ends)."""
    return [event.removeprefix(b"data: ") for event in body.split(b"\n\n") if event]


def provider_stream(stack: Stack, completion_id: str, include_usage: bool) -> bytes:
    """What the fake provider sends for the last request it received, asked for usage or
    not (provider_wire builds the same bytes the provider sent)."""
    received = stack.received("o1")[-1]
    completion = provider_wire.make_completion(completion_id, "o1", received.json(),
                                               len(received.body))
    fake = stack.providers.provider("o1").behaviour
    return b"".join(provider_wire.openai_events(completion, include_usage,
                                                spaced=fake.spaced_json,
                                                timings=fake.engine_timings))


def raw_sdk_stream(stack: Stack, **extra: Any) -> bytes:
    """The caller's stream as bytes, read through the SDK's streaming response."""
    with stack.openai.chat.completions.with_streaming_response.create(
            model="priced", messages=prompt(), stream=True, **extra) as response:
        return b"".join(response.iter_bytes())


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_the_unasked_usage_chunk_never_reaches_the_sdk_and_the_final_chunk_is_whole(
        fresh: Stack, name: str) -> None:
    fresh.behave("o1", BEHAVIOURS[name])
    timings = fresh.providers.provider("o1").behaviour.engine_timings
    started = time.time()
    chunks = list(fresh.openai.chat.completions.create(model="priced", messages=prompt(),
                                                       stream=True))
    assert chunks and all(chunk.choices for chunk in chunks)  # no empty-choices chunk
    assert all(chunk.usage is None for chunk in chunks)
    final = chunks[-1]
    assert final.choices[0].finish_reason == "stop"
    assert [chunk for chunk in chunks if chunk.choices[0].finish_reason] == [final]
    received = fresh.received("o1")[-1]
    assert received.json()["stream_options"] == {"include_usage": True}  # asked upstream
    completion = provider_wire.make_completion(final.id, "o1", received.json(),
                                               len(received.body))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == completion.text
    if timings:  # on the final chunk, where llama.cpp puts them for a caller that did not ask
        assert (final.model_extra or {}).get("timings") == provider_wire.llama_cpp_timings(
            completion)
    row = fresh.row("priced", started)
    assert row["usage_source"] == "reported"
    assert (row["input_tokens"], row["output_tokens"]) == (completion.prompt_tokens,
                                                           completion.completion_tokens)

    # The wire: every event as the provider sends it unasked, byte for byte, but the final
    # chunk, which is JSON-equal to it (the usage chunk's members spliced in).
    got = events_of(raw_sdk_stream(fresh))
    completion_id = json.loads(got[0])["id"]
    want = events_of(provider_stream(fresh, completion_id, include_usage=False))
    assert len(got) == len(want) and got[-1] == want[-1] == b"[DONE]"
    assert got[:-2] == want[:-2]
    assert json.loads(got[-2]) == json.loads(want[-2])
    if not timings:
        assert got[-2] == want[-2]


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_a_caller_that_asks_for_usage_gets_the_usage_chunk_unchanged(
        fresh: Stack, name: str) -> None:
    fresh.behave("o1", BEHAVIOURS[name])
    body = raw_sdk_stream(fresh, stream_options={"include_usage": True})
    completion_id = json.loads(events_of(body)[0])["id"]
    assert body == provider_stream(fresh, completion_id, include_usage=True)
    usage = json.loads(events_of(body)[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
