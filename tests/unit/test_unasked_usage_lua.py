"""The unasked-usage filter's Lua (envoy_config/unasked_usage.lua), run in LuaJIT through
Envoy's Lua API stand-ins (tests/envoy_lua.py), over generated streams (issue #40,
observations 5 and 6): JSON written compact, spaced, over several lines, in any key order,
with escapes in keys and values, strings that contain `"usage"`, `[]` or `}`; SSE with LF,
CRLF or CR line ends, `data:` with or without its space, data over several lines, comments,
`event:` and `id:` lines; the body cut into writes anywhere.

What the caller must see, as parsed events (the WHATWG rules): every event the provider sent
except the usage chunk (top-level `choices` an empty array and `usage` an object); the JSON
of the others as sent minus a top-level `"usage": null`, and byte for byte when there is
nothing to remove; the usage chunk's members that the final chunk (the one carrying a
`finish_reason`, held until the next event) lacks, in that final chunk, but the usage, the
empty choices and the stream's identity (id, object, created, model, system_fingerprint);
and after every
write, every event the input's whole events give, but the held one.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.envoy_config.unasked_usage import MAX_CARRY_BYTES, MAX_HELD_BYTES
from sidecar.envoy_config.unasked_usage import unasked_usage_script as script
from tests.envoy_lua import LuaFilter

_FILTER = LuaFilter(script())


def small_bounds_filter(carry: int, held: int) -> LuaFilter:
    source = script().replace(f"local MAX_CARRY_BYTES = {MAX_CARRY_BYTES}\n",
                              f"local MAX_CARRY_BYTES = {carry}\n", 1)
    return LuaFilter(source.replace(f"local MAX_HELD_BYTES = {MAX_HELD_BYTES}\n",
                                    f"local MAX_HELD_BYTES = {held}\n", 1))


# --- The caller's side: an SSE parser after the WHATWG HTML standard -------------------------

def sse_events(body: bytes) -> list[tuple[str, str]]:
    """(type, data) of each dispatched event; an unfinished last event is discarded. Lines
    are decoded once whole (what went out so far may end inside a character)."""
    lines = re.split(rb"\r\n|\n|\r", body)
    events, data, kind = [], [], ""
    for line in (raw.decode() for raw in lines[:-1]):
        if line == "":
            if data:
                events.append((kind or "message", "\n".join(data)))
            data, kind = [], ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
    return events


# --- The provider's side: JSON in any formatting, SSE in any framing --------------------------

_SPACES = ["", "", "", " ", " ", "  ", "\n", "\t", " \n  "]


def render_string(text: str, rnd: random.Random) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch if rnd.random() < 0.7 else f"\\u{code:04x}")
        elif code < 0x20:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\u{code:04X}"))
        elif ch == "/" and rnd.random() < 0.5:
            out.append("\\/")
        elif rnd.random() < 0.15:  # any character may be written as \uXXXX
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}")
            else:
                out.append(f"\\u{code:04x}" if rnd.random() < 0.5 else f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def render(value: Any, rnd: random.Random) -> str:
    """JSON text of `value` with random spacing (LF, tab, space; never CR, which would end
    an SSE line), keys in the dict's order, random escapes."""
    def ws() -> str:
        return rnd.choice(_SPACES)
    if isinstance(value, dict):
        if not value:
            return "{" + ws() + "}"
        return "{" + ",".join(ws() + render_string(key, rnd) + ws() + ":" + ws()
                              + render(item, rnd) + ws() for key, item in value.items()) + "}"
    if isinstance(value, list):
        if not value:
            return "[" + ws() + "]"
        return "[" + ",".join(ws() + render(item, rnd) + ws() for item in value) + "]"
    if isinstance(value, str):
        return render_string(value, rnd)
    return json.dumps(value)


_TRICKY = st.sampled_from(['"usage": {', '"choices": []', "}", "[]", ',"usage":null', "{",
                           "data: x", "\\", "usage", "\n\n", '"}', "é", "💡", "finish_reason"])
_TEXT = _TRICKY | st.text(max_size=6)
_SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**12) | _TEXT | st.floats(
    allow_nan=False, allow_infinity=False, width=32)
_NESTED = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    _TEXT, inner, max_size=3), max_leaves=4)
_EXTRA_KEYS = st.sampled_from(["timings", "x_groq", "prompt_progress", "usage_details", "é",
                               "usage ", "Usage", "choices_"]) | st.text(min_size=1, max_size=5)


@st.composite
def identity(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "chatcmpl-" + draw(st.text("abc123", max_size=4)),
                           "object": "chat.completion.chunk", "created": 1_700_000_000,
                           "model": draw(st.sampled_from(["m", "tiny.gguf", 'q"uoted']))}
    if draw(st.booleans()):
        out["system_fingerprint"] = "b1-abc"
    if draw(st.booleans()):
        out["service_tier"] = "default"
    return out


@st.composite
def content_chunk(draw: st.DrawFn, finish: bool = False) -> dict[str, Any]:
    choices = [{"index": index, "delta": draw(st.sampled_from([{}, {"role": "assistant"}]) |
                                              st.builds(lambda t: {"content": t}, _TEXT)),
                "finish_reason": draw(st.sampled_from(["stop", "length", "tool_calls"]))
                if finish and index == 0 else None}
               for index in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        choices[0]["logprobs"] = None
    out = {**draw(identity()), "choices": choices}
    if draw(st.integers(0, 3)):
        out["usage"] = None  # OpenAI's, on every chunk when usage is asked
    if draw(st.integers(0, 4)) == 0:
        out[draw(_EXTRA_KEYS)] = draw(_NESTED)
    return out


@st.composite
def usage_chunk(draw: st.DrawFn) -> dict[str, Any]:
    usage = {"prompt_tokens": draw(st.integers(0, 9999)),
             "completion_tokens": draw(st.integers(0, 9999)), "total_tokens": 1}
    if draw(st.booleans()):
        usage["prompt_tokens_details"] = {"cached_tokens": 0, "audio_tokens": None}
    out = {**draw(identity()), "choices": [], "usage": usage}
    for _ in range(draw(st.integers(0, 2))):  # what llama.cpp moves here: `timings`
        out[draw(_EXTRA_KEYS)] = draw(_NESTED)
    return out


# Data that is not a usage chunk and has nothing to remove (or is no JSON object at all).
_OTHER_DATA = st.sampled_from([
    "[DONE]", "{not json", '{"choices": [], "usage": {}', "", "null", "[1, 2]",
    '"choices"', '{"choices": [], "usage": {}} trailing', '{"a": 1,}', '{"a": 01}',
    '{"a": "\x01"}', '{"a": tru}', '{"a" 1}', "{\"a\": \"\\x\"}",
]) | st.builds(lambda usage: {"usage": usage}, _NESTED) | st.builds(
    lambda choices: {"choices": choices, "usage": {"total_tokens": 3}},
    st.lists(st.just({"index": 0, "delta": {}}), min_size=1, max_size=2)) | st.builds(
    lambda extra: {"choices": [], "usage": extra}, _SCALARS.filter(lambda v: v is not None)
    | st.lists(_SCALARS, max_size=2))


@dataclass
class Block:
    """One event (or comment block) as the provider writes it."""

    raw: str
    data: str | None  # None: a block without fields (comments)
    kind: str = "message"

    @property
    def size(self) -> int:
        return len(self.raw.encode())

    @property
    def value(self) -> Any:
        try:
            return json.loads(self.data)
        except (TypeError, ValueError):
            return None


@st.composite
def block(draw: st.DrawFn, payload: Any, rnd: random.Random) -> Block:
    if payload == ":comment":
        end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
        return Block(": keep-alive" + end + end, None)
    data = payload if isinstance(payload, str) else render(payload, rnd)
    end = draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
    lines = []
    for piece in data.split("\n"):
        space = " " if piece.startswith(" ") or draw(st.integers(0, 3)) else ""
        lines.append("data:" + space + piece if piece or draw(st.booleans()) else "data")
    kind = "message"
    if draw(st.integers(0, 6)) == 0:
        kind = draw(st.sampled_from(["message", "chunk"]))
        lines.insert(draw(st.integers(0, len(lines))), "event: " + kind)
    if draw(st.integers(0, 6)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), "id: 7")
    if draw(st.integers(0, 8)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), ": note")
    return Block("".join(line + end for line in lines) + end, data, kind)


def shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {key: shuffled(item, rnd) for key, item in items}
    return value


@st.composite
def stream(draw: st.DrawFn) -> list[Block]:
    """A Chat stream as a provider sends it when usage is asked, and variations: events
    around, between and instead of the usual ones."""
    rnd = draw(st.randoms(use_true_random=False))
    payloads: list[Any] = [draw(content_chunk()) for _ in range(draw(st.integers(0, 3)))]
    for _ in range(draw(st.integers(1, 2))):
        payloads.append(draw(content_chunk(finish=True)))
    if draw(st.integers(0, 5)):
        payloads.append(draw(usage_chunk()))
    if draw(st.integers(0, 5)):
        payloads.append("[DONE]")
    for _ in range(draw(st.integers(0, 3))):
        extra = draw(_OTHER_DATA | usage_chunk() | content_chunk(finish=True)
                     | content_chunk() | st.just(":comment"))
        payloads.insert(draw(st.integers(0, len(payloads))), extra)
    return [draw(block(shuffled(payload, rnd), rnd)) for payload in payloads]


@st.composite
def cuts(draw: st.DrawFn, size: int) -> list[int]:
    return sorted(set(draw(st.lists(st.integers(1, max(1, size - 1)), max_size=8))))


def writes_of(body: bytes, at: list[int], empty_end: bool) -> list[bytes]:
    edges = [0, *[cut for cut in at if 0 < cut < len(body)], len(body)]
    writes = [body[a:b] for a, b in pairwise(edges)]
    return [*writes, b""] if empty_end else writes


# --- What the caller should get ---------------------------------------------------------------

# The usage chunk's members that never go into the final chunk: the usage itself, its empty
# choices and the stream's identity, which the final chunk has its own of.
_NOT_SPLICED = ("usage", "choices", "id", "object", "created", "model", "system_fingerprint")


def is_usage_chunk(value: Any) -> bool:
    return (isinstance(value, dict) and value.get("choices") == []
            and isinstance(value.get("usage"), dict))


def finishes(value: Any) -> bool:
    choices = value.get("choices") if isinstance(value, dict) else None
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and choice.get("finish_reason") is not None
        for choice in choices)


@dataclass
class Expected:
    kind: str
    data: str  # the provider's data, as sent
    value: Any = None  # JSON the caller's data must equal when `edited`
    edited: bool = False


def expected_events(blocks: list[Block], offsets: list[int], at: list[int], flush: bool,
                    carry: int = MAX_CARRY_BYTES, held_max: int = MAX_HELD_BYTES,
                    ) -> list[Expected]:
    """The filter's rules over the provider's blocks (`offsets`: where each starts in the
    body; `at`: where the body is cut into writes; `flush`: the stream's end came with a
    chunk, which takes the held one)."""
    out: list[Expected] = []
    held: tuple[Expected, dict] | None = None

    def release(extra: dict | None = None) -> None:
        nonlocal held
        if held is not None:
            event, value = held
            if extra:
                event.value = {**value, **extra}
                event.edited = True
            out.append(event)
            held = None

    for start, item in zip(offsets, blocks, strict=True):
        if item.data is None:
            continue
        # Complete once its blank line is in; a CRLF blank line already at its CR.
        complete = start + item.size - (1 if item.raw.endswith("\r\n") else 0)
        raw_size = item.size
        if complete in at and item.raw.endswith("\r\n"):
            raw_size -= 1
        if any(start < cut < complete and cut - start > carry for cut in at):
            release()  # cut and oversized: passes unedited
            out.append(Expected(item.kind, item.data))
            continue
        value = item.value
        if is_usage_chunk(value):
            if held is not None:
                has = {*held[1], *_NOT_SPLICED}
                release({key: part for key, part in value.items() if key not in has})
            continue
        release()
        event = Expected(item.kind, item.data, value)
        if isinstance(value, dict) and "usage" in value and value["usage"] is None:
            value = {key: part for key, part in value.items() if key != "usage"}
            event.value, event.edited = value, True
        if finishes(value) and raw_size <= held_max:
            held = (event, value)
        else:
            out.append(event)
    if flush:
        release()
    return out


def check(got: list[tuple[str, str]], want: list[Expected]) -> None:
    assert [kind for kind, _ in got] == [event.kind for event in want], (got, want)
    for (_, data), event in zip(got, want, strict=True):
        if event.edited:
            assert json.loads(data) == event.value, (data, event)
            assert isinstance(json.loads(data), dict)
        else:
            assert data == event.data  # byte for byte
        if isinstance(event.value, dict):
            # never an empty-choices chunk the caller did not ask for
            assert not is_usage_chunk(json.loads(data))


def run(blocks: list[Block], at: list[int], empty_end: bool, trailers: bool = False,
        lua: LuaFilter = _FILTER, **bounds: int) -> None:
    body = "".join(item.raw for item in blocks).encode()
    offsets, position = [], 0
    for item in blocks:
        offsets.append(position)
        position += item.size
    at = [cut for cut in at if 0 < cut < len(body)]
    writes = writes_of(body, at, empty_end)
    response = lua.respond(writes, trailers=trailers)
    check(sse_events(response.body),
          expected_events(blocks, offsets, at, flush=not trailers, **bounds))
    # Nothing waits longer than it must: after each write, every event of the input's whole
    # events so far is out, but the held final chunk.
    sent = 0
    for k, write in enumerate(writes[:-1]):
        sent += len(write)
        whole = [item for item, start in zip(blocks, offsets, strict=True)
                 if start + item.size - item.raw.endswith("\r\n") <= sent]
        check(sse_events(b"".join(response.writes[:k + 1])),
              expected_events(whole, offsets[:len(whole)], [cut for cut in at if cut <= sent],
                              flush=False,
                              **bounds))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_generated_streams_in_any_formatting_and_any_writes(data: st.DataObject) -> None:
    blocks = data.draw(stream())
    size = sum(item.size for item in blocks)
    run(blocks, data.draw(cuts(size)), data.draw(st.booleans()))


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_bounds_an_oversized_cut_event_passes_unedited_and_the_rest_is_still_read(
        data: st.DataObject) -> None:
    """With small bounds (so that generated events cross them): an event cut after more than
    the carry bound passes as it is, and so does the rest of it; the events after it are
    read as usual; a final chunk over the held bound is not held."""
    carry, held = data.draw(st.sampled_from([(40, 120), (90, 60), (200, 400)]))
    blocks = data.draw(stream())
    size = sum(item.size for item in blocks)
    run(blocks, data.draw(cuts(size)), data.draw(st.booleans()),
        lua=small_bounds_filter(carry, held), carry=carry, held_max=held)


# --- Named cases (each also in the generated ones) ---------------------------------------------

def chat_stream(dumps: Any, usage_extra: dict | None = None, final_extra: dict | None = None,
                ) -> list[bytes]:
    """A Chat stream asked for usage, each event written with `dumps`; the final chunk and
    the usage chunk in one write, as llama.cpp sends them (format_oai_sse of an array)."""
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    def event(value: dict) -> bytes:
        return b"data: " + dumps(value).encode() + b"\n\n"
    return [event({**head, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                        "finish_reason": None}], "usage": None}),
            event({**head, "choices": [{"index": 0, "delta": {"content": "Hi"},
                                        "finish_reason": None}], "usage": None}),
            event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": None, **(final_extra or {})})
            + event({**head, "choices": [], "usage": {"prompt_tokens": 5,
                                                      "completion_tokens": 2,
                                                      "total_tokens": 7},
                     **(usage_extra or {})}),
            b"data: [DONE]\n\n"]


def caller_sees(writes: list[bytes], lua: LuaFilter = _FILTER) -> list[Any]:
    return [data if data == "[DONE]" else json.loads(data)
            for _, data in sse_events(lua.respond(writes).body)]


SPACED = json.dumps  # Python's default: `"choices": []`, `"usage": {`


@pytest.mark.parametrize("dumps", [SPACED, lambda v: json.dumps(v, separators=(",", ":")),
                                   lambda v: json.dumps(v, indent=2).replace("\n", " "),
                                   lambda v: json.dumps(v).replace('"usage"', '"us\\u0061ge"')])
def test_the_usage_chunk_is_dropped_however_the_provider_spaces_its_json(dumps: Any) -> None:
    """Issue #40, observation 5: spaced JSON (`"choices": []`, `"usage": {`) leaked the
    chunk (171 streams of a 5.5-minute soak); the byte patterns matched compact JSON only."""
    events = caller_sees(chat_stream(dumps))
    assert events[-1] == "[DONE]"
    assert [event["choices"][0]["delta"] for event in events[:-1]] == [
        {"role": "assistant"}, {"content": "Hi"}, {}]
    assert all("usage" not in event for event in events[:-1])


def test_llama_cpp_timings_reach_the_caller_on_its_final_chunk() -> None:
    """Issue #40, observation 6: asked for usage, llama.cpp moves `timings` from its final
    chunk to the usage chunk (tools/server/server-task.cpp, to_json_oaicompat_chat_stream:
    `deltas.back()["timings"]`; nlohmann's compact dump, keys sorted). The caller that did not
    ask gets them where llama.cpp would have put them: on the chunk with `finish_reason`."""
    timings = {"cache_n": 0, "prompt_n": 5, "prompt_ms": 1.5, "predicted_n": 2,
               "predicted_ms": 3.25, "predicted_per_second": 615.4}
    def dumps(value: dict) -> str:
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    events = caller_sees(chat_stream(dumps, usage_extra={
        "system_fingerprint": "b1-x", "timings": timings}, final_extra={
        "system_fingerprint": "b1-x"}))
    final = events[-2]
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["timings"] == timings
    assert final["system_fingerprint"] == "b1-x"
    assert "usage" not in final and len(events) == 4
    # The stream's identity stays the final chunk's own: a fingerprint only the usage chunk
    # has is not added (nor are its id, model, created, object).
    events = caller_sees(chat_stream(dumps, usage_extra={
        "system_fingerprint": "b1-x", "id": "other", "timings": timings}))
    assert events[-2]["timings"] == timings and events[-2]["id"] == "c1"
    assert "system_fingerprint" not in events[-2]


def test_every_split_point_and_byte_by_byte() -> None:
    writes = chat_stream(SPACED, usage_extra={"timings": {"n": 1}})
    body = b"".join(writes)
    want = caller_sees(writes)
    assert want[-2]["timings"] == {"n": 1} and len(want) == 4
    for cut in range(1, len(body)):
        assert caller_sees([body[:cut], body[cut:]]) == want, cut
    assert caller_sees([body[k:k + 1] for k in range(len(body))]) == want
    assert caller_sees([body]) == want


def test_an_event_that_is_not_a_json_object_passes_byte_for_byte() -> None:
    body = (b"data: [DONE]\n\ndata: {\"choices\": [], \"usage\": {}\n\n: c\n\n"
            b"data: {\"choices\": [], \"usage\": {}} x\n\nevent: e\ndata: 1\r\n\r\n")
    assert _FILTER.respond([body]).body == body


@given(st.binary(max_size=300).map(lambda raw: raw.replace(b"{", b"(")), st.data())
@settings(max_examples=200, deadline=None)
def test_bytes_without_json_objects_pass_unchanged(raw: bytes, data: st.DataObject) -> None:
    """Whatever the bytes (invalid UTF-8 too), the script never fails, and without a JSON
    object it edits nothing: the caller gets them all but an unfinished last event."""
    at = data.draw(cuts(len(raw)))
    out = _FILTER.respond(writes_of(raw, at, False)).body
    assert raw.startswith(out)
    assert b"\n\n" not in raw[len(out):] and b"\r\r" not in raw[len(out):]


def test_an_oversized_cut_event_passes_unedited_and_the_next_usage_chunk_is_still_dropped(
        ) -> None:
    big = {"choices": [], "usage": {"pad": "x" * (MAX_CARRY_BYTES + 100_000)}}
    body = (b"data: " + json.dumps(big).encode() + b"\n\n"
            + b"".join(chat_stream(SPACED)))
    writes = [body[k:k + 65536] for k in range(0, len(body), 65536)]
    out = _FILTER.respond(writes).body
    events = sse_events(out)
    assert events[0][1] == json.dumps(big)  # cut and too long to hold: as it came
    assert [json.loads(data) if data != "[DONE]" else data for _, data in events[1:]] == \
        caller_sees(chat_stream(SPACED))


def test_the_held_final_chunk_goes_out_with_the_stream_end() -> None:
    """No usage chunk, no [DONE]: the final chunk waits for a next event that never comes,
    and leaves with the last chunk of the stream (an empty one, as HTTP/1.1's last chunk);
    a stream that ends with trailers has no chunk left to carry it."""
    first, second, both = chat_stream(SPACED)[:3]
    writes = [first, second, both[:both.index(b"\n\n") + 2]]  # the final chunk alone
    for ending in ([], [b""]):
        events = caller_sees([*writes, *ending])
        assert events[-1]["choices"][0]["finish_reason"] == "stop"
    response = _FILTER.respond(writes, trailers=True)
    assert [json.loads(data)["choices"][0]["delta"]
            for _, data in sse_events(response.body)] == [{"role": "assistant"},
                                                          {"content": "Hi"}]


def test_only_event_streams_are_read_and_their_declared_length_is_removed() -> None:
    body = b"".join(chat_stream(SPACED))
    plain = _FILTER.respond([body], {"content-type": "application/json",
                                     "content-length": str(len(body))})
    assert plain.body == body and plain.headers["content-length"] == str(len(body))
    stream_reply = _FILTER.respond([body], {"content-type": "text/event-stream; charset=utf-8",
                                            "content-length": str(len(body))})
    assert "content-length" not in stream_reply.headers
    assert len(stream_reply.body) < len(body)


def test_a_failing_read_passes_the_rest_of_the_stream_as_it_comes() -> None:
    """Should the script ever fail on a write (it never has on generated bytes; Envoy's Lua
    can still run out of memory), the held final chunk, the carried start of an event and
    everything after go to the caller unedited: nothing lost, nothing twice."""
    failing = LuaFilter(script().replace(
        "local function read_object(data)\n",
        "local function read_object(data)\n  if find(data, 'BOOM', 1, true) then "
        "error('boom') end\n", 1))
    first, second, both, done = chat_stream(SPACED)
    cut = both.index(b"\n\n") + 2  # the final chunk alone, held
    boom = b'data: {"BOOM": 1}\n\n'
    writes = [first, second, both[:cut], both[cut:cut + 9], both[cut + 9:] + boom + done[:4],
              done[4:]]
    out = failing.respond(writes).body
    assert out.startswith(b"".join(writes[:2]).replace(b', "usage": null', b""))
    assert out.endswith(both + boom + done)


def test_nesting_deeper_than_the_reader_goes_is_not_json_to_it() -> None:
    deep = "[" * 200 + "]" * 200
    body = ('data: {"choices": [], "usage": {"x": ' + deep + "}}\n\n").encode()
    assert _FILTER.respond([body]).body == body
