"""Parse a JSON request body once and rewrite its top-level `model` without re-serialising.

Re-serialising a parsed body costs time in proportion to its size (a 1 MB prompt or image
takes milliseconds) and changes bytes the caller sent. Instead the rewrite splices one JSON
string in at the byte span of the top-level `model` value. Two ways find that span:

- **Fast (bodies from 8 KiB):** a walk over the raw bytes that jumps from
  token to token (quotes and brackets; a string is skipped with one `find` per quote) and
  only looks at keys of the top-level object, then a full validating parse by pydantic-core's
  JSON parser (Rust), which reads a 1 MB base64 image about 8× faster than the standard
  library. The walk has a token budget proportional to the body's size (an escaped quote
  counts as a token, and a run of backslashes is followed only so far), so bodies made of
  many small strings or escapes, where a Python-level walk would be slower, go the other
  way; the walk's work is bounded whatever the body.
- **Exact fallback:** the standard library's C scanner walks the top-level object member by
  member. It also decides every error message and every case the fast parser refuses but
  the standard library accepts (lone surrogate escapes).

Both give the same payload and span (property-tested against each other).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from pydantic_core import from_json

_WHITESPACE = re.compile(r"[ \t\n\r]*")


class BodyError(ValueError):
    """The body is not a JSON object; the message is safe to show the caller."""


# Two top-level members of one name: JSON parsers disagree on which one counts (Python's
# and most keep the last, some the first), so a provider could serve another `model`, or
# stream where the router decided on JSON. Refused, as ambiguous. (Nested duplicates are
# not looked for: they change no decision the forwarded body depends on.)
_NAME_SHOWN = 64


def duplicate_member(name: str) -> BodyError:
    shown = name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."
    return BodyError(f"Request body has more than one top-level {shown!r} member")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN = _DECODER.scan_once


@dataclass(frozen=True, slots=True)
class ParsedBody:
    payload: dict[str, Any]
    raw: bytes
    model_span: tuple[int, int] | None  # byte offsets of the top-level "model" string value

    def with_model(self, model_ref: str) -> bytes:
        """The body with its top-level "model" string replaced by `model_ref`."""
        return b"".join(self.model_replaced(model_ref))

    def model_replaced(self, model_ref: str,
                       ask_usage: bool = False) -> tuple[bytes | memoryview, ...]:
        """The same body as pieces to be sent one after another (views of the original
        around the new value), so a large body is not copied to be rewritten. With
        `ask_usage`, the body also asks an OpenAI Chat stream for its usage
        (`stream_options.include_usage`; usage_asked says when that is needed)."""
        if ask_usage and "stream_options" in self.payload:  # merge into the caller's own
            options = self.payload["stream_options"]
            merged = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            return (json.dumps({**self.payload, "model": model_ref,
                                "stream_options": merged}).encode(),)
        if self.model_span is None:
            extra = {"stream_options": {"include_usage": True}} if ask_usage else {}
            return (json.dumps({**self.payload, "model": model_ref, **extra}).encode(),)
        start, end = self.model_span
        view = memoryview(self.raw)
        if not ask_usage:
            return view[:start], json.dumps(model_ref).encode(), view[end:]
        opening = _skip_bytes(self.raw, 0) + 1  # just past the object's `{`
        return (view[:opening], _ASK_USAGE, view[opening:start], json.dumps(model_ref).encode(),
                view[end:])

    def usage_asked(self) -> bool:
        """Whether a streaming Chat request already asks for its usage."""
        options = self.payload.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True


_ASK_USAGE = b'"stream_options":{"include_usage":true},'


def _skip_bytes(raw: bytes, index: int) -> int:
    return _SPACE.match(raw, index).end()  # type: ignore[union-attr]


def parse_body(body: bytes) -> ParsedBody:
    if len(body) < _FAST_FROM_BYTES:  # small bodies: the C scanner is quicker outright
        return _parse_exact(body)
    return _parse_fast(body) or _parse_exact(body)


def _parse_exact(body: bytes) -> ParsedBody:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("Request body is not valid JSON (not UTF-8)") from None
    try:
        payload, span = _parse_object(text)
    except RecursionError:
        raise BodyError("Request body is nested too deeply") from None
    except (ValueError, StopIteration, IndexError) as exc:
        if isinstance(exc, BodyError):
            raise
        raise BodyError("Request body is not valid JSON") from None
    if span is not None and len(text) != len(body):  # character offsets → byte offsets
        start = len(text[:span[0]].encode())
        span = (start, start + len(text[span[0]:span[1]].encode()))
    return ParsedBody(payload, body, span)


# --- fast path -----------------------------------------------------------------------------

_TOKEN = re.compile(rb'["{}\[\]]')
_SPACE = re.compile(rb"[ \t\n\r]*")
_FAST_FROM_BYTES = 8 * 1024
_MIN_BUDGET = 64
_BYTES_PER_TOKEN = 2048
_MAX_BACKSLASHES = 64


class _Malformed(Exception):
    """The walk met something that is not JSON; the exact path will say what."""


class _OverBudget(Exception):
    """More tokens (or escapes) than the walk may spend; the exact path is quicker."""


def _parse_fast(body: bytes, budget: int | None = None) -> ParsedBody | None:
    """None when the walk ran out of budget (by default proportional to the body's size) or
    the body is not (fast-parseable) JSON."""
    if budget is None:
        budget = _MIN_BUDGET + len(body) // _BYTES_PER_TOKEN
    try:
        span = _top_level_model_span(body, budget)
    except BodyError:
        raise
    except (_Malformed, _OverBudget, IndexError, ValueError):
        return None
    try:
        payload = from_json(body, allow_inf_nan=False)
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict):
        return None
    if not isinstance(payload.get("model"), str):
        span = None
    return ParsedBody(payload, body, span)


def _string_end(raw: bytes, quote: int, budget: int) -> tuple[int, int]:
    """Index just past the string that opens at `quote`, and the budget left: an escaped
    quote inside costs a token, and a run of backslashes is looked at only so far."""
    index = quote
    while True:
        index = raw.find(b'"', index + 1)
        if index < 0:
            raise _Malformed
        before = index - 1
        while raw[before] == 0x5C:  # backslash
            before -= 1
            if index - before > _MAX_BACKSLASHES:
                raise _OverBudget
        if (index - 1 - before) % 2 == 0:
            return index + 1, budget
        budget -= 1
        if budget < 0:
            raise _OverBudget


def _member_name(key: bytes) -> str:
    """The name a quoted member name stands for (escapes resolved only where there are any:
    `"\\u006dodel"` is `model`)."""
    return json.loads(key) if b"\\" in key else key[1:-1].decode("utf-8", "replace")


def _top_level_model_span(raw: bytes, budget: int) -> tuple[int, int] | None:
    """Byte span of the last top-level "model" string value, None if there is none. Assumes
    JSON (validity is checked after); raises _OverBudget past `budget` tokens."""
    depth = 0
    span: tuple[int, int] | None = None
    seen: set[str] = set()
    index = 0
    search, space = _TOKEN.search, _SPACE.match
    while (found := search(raw, index)) is not None:
        budget -= 1
        if budget < 0:
            raise _OverBudget
        index = found.start()
        char = raw[index]
        if char == 0x22:  # a string
            end, budget = _string_end(raw, index, budget)
            if depth == 1:
                colon = space(raw, end).end()
                if raw[colon:colon + 1] == b":":  # a member name of the top-level object
                    value = space(raw, colon + 1).end()
                    name = _member_name(raw[index:end])
                    if name in seen:
                        raise duplicate_member(name)
                    seen.add(name)
                    if name == "model":
                        span = None
                        if raw[value:value + 1] == b'"':
                            value_end, budget = _string_end(raw, value, budget)
                            span = (value, value_end)
                            index = value_end
                            continue
                    index = value
                    continue
            index = end
        else:
            depth += 1 if char in (0x7B, 0x5B) else -1  # { [ open, } ] close
            index += 1
    return span


# --- exact path ----------------------------------------------------------------------------

def _skip(text: str, index: int) -> int:
    return _WHITESPACE.match(text, index).end()  # type: ignore[union-attr]


def _parse_object(text: str) -> tuple[dict[str, Any], tuple[int, int] | None]:
    index = _skip(text, 0)
    if text[index:index + 1] != "{":
        _DECODER.decode(text)  # raises if not JSON at all
        raise BodyError("Request body must be a JSON object")
    payload: dict[str, Any] = {}
    span: tuple[int, int] | None = None
    index = _skip(text, index + 1)
    if text[index:index + 1] == "}":
        if _skip(text, index + 1) != len(text):
            _raise_extra()
        return payload, None
    while True:
        if text[index:index + 1] != '"':
            raise ValueError("expected a member name")
        key, index = scanstring(text, index + 1)
        index = _skip(text, index)
        if text[index:index + 1] != ":":
            raise ValueError("expected ':'")
        start = _skip(text, index + 1)
        value, index = _SCAN(text, start)
        if key in payload:
            raise duplicate_member(key)
        if key == "model":
            span = (start, index) if isinstance(value, str) else None
        payload[key] = value
        index = _skip(text, index)
        separator = text[index:index + 1]
        if separator == "}":
            break
        if separator != ",":
            raise ValueError("expected ',' or '}'")
        index = _skip(text, index + 1)
    if _skip(text, index + 1) != len(text):
        _raise_extra()
    return payload, span


def _raise_extra() -> None:
    raise ValueError("extra data after the JSON object")
