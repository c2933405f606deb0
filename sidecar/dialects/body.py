"""Parse a JSON request body once and rewrite its top-level `model` without re-serialising.

Re-serialising a parsed body costs time in proportion to its size (a 1 MB prompt or image
takes milliseconds) and changes bytes the caller sent. Instead the top-level object is walked
with the standard library's C scanner, member by member, which parses exactly once and
remembers where the `model` value's text is; the rewrite then splices one JSON string in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

_WHITESPACE = re.compile(r"[ \t\n\r]*")


class BodyError(ValueError):
    """The body is not a JSON object; the message is safe to show the caller."""


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN = _DECODER.scan_once


@dataclass(frozen=True, slots=True)
class ParsedBody:
    payload: dict[str, Any]
    text: str
    model_span: tuple[int, int] | None

    def with_model(self, model_ref: str) -> bytes:
        """The body with its top-level "model" string replaced by `model_ref`."""
        encoded = json.dumps(model_ref)
        if self.model_span is None:
            payload = {**self.payload, "model": model_ref}
            return json.dumps(payload).encode()
        start, end = self.model_span
        return (self.text[:start] + encoded + self.text[end:]).encode()


def parse_body(body: bytes) -> ParsedBody:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("Request body is not valid JSON (not UTF-8)") from None
    try:
        return _parse_object(text)
    except RecursionError:
        raise BodyError("Request body is nested too deeply") from None
    except (ValueError, StopIteration, IndexError) as exc:
        if isinstance(exc, BodyError):
            raise
        raise BodyError("Request body is not valid JSON") from None


def _skip(text: str, index: int) -> int:
    return _WHITESPACE.match(text, index).end()  # type: ignore[union-attr]


def _parse_object(text: str) -> ParsedBody:
    index = _skip(text, 0)
    if text[index:index + 1] != "{":
        _DECODER.decode(text)  # raises if not JSON at all
        raise BodyError("Request body must be a JSON object")
    payload: dict[str, Any] = {}
    span: tuple[int, int] | None = None
    index = _skip(text, index + 1)
    if text[index:index + 1] == "}":
        return ParsedBody(payload, text, None) if _skip(text, index + 1) == len(text) else (
            _raise_extra())
    while True:
        if text[index:index + 1] != '"':
            raise ValueError("expected a member name")
        key, index = scanstring(text, index + 1)
        index = _skip(text, index)
        if text[index:index + 1] != ":":
            raise ValueError("expected ':'")
        start = _skip(text, index + 1)
        value, index = _SCAN(text, start)
        payload[key] = value
        if key == "model":
            span = (start, index) if isinstance(value, str) else None
        index = _skip(text, index)
        separator = text[index:index + 1]
        if separator == "}":
            break
        if separator != ",":
            raise ValueError("expected ',' or '}'")
        index = _skip(text, index + 1)
    if _skip(text, index + 1) != len(text):
        _raise_extra()
    return ParsedBody(payload, text, span)


def _raise_extra() -> ParsedBody:
    raise ValueError("extra data after the JSON object")
