"""Which refusal of the catalogue (refusal_catalogue.py) a provider's error reply is, read
as JSON: its status, its error's type and code, and its message's wording.

Read where a reply is held before the router commits (the reply gate, gateway/reply_gate.py;
the hold's Lua gives the same answers from envoy_config/refusal_lua.py), so that a
context-length refusal goes on to the next target instead of back to the caller, and an
error reply no entry knows is named to the operator (observe/access_log.py counts it).

Only a body of at most `SCANNED_BYTES` is read: error replies are short, and a longer one
is no refusal the catalogue knows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sidecar.observe.refusal_catalogue import CATALOGUE, REFUSAL_STATUSES, Refusal, Verdict

SCANNED_BYTES = 16 * 1024
# What a type or code may show of itself in a header and a log line: a provider's token,
# never free text (it may echo the prompt otherwise).
_TOKEN = re.compile(r"[^A-Za-z0-9_.-]")
MAX_TOKEN_CHARS = 48


@dataclass(frozen=True, slots=True)
class ErrorFields:
    """The parts of an error body the catalogue matches on, lower-cased."""

    error_type: str = ""
    error_code: str = ""
    message: str = ""


def _text(value: object) -> str:
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return ""


def error_fields(body: bytes) -> ErrorFields | None:
    """The error's type, code and message, from the shapes providers use: OpenAI's
    `{"error": {type, code, message}}` (and Anthropic's, inside `{"type": "error"}`),
    vLLM's and Bedrock's top-level `{type, code, message}`, TGI's and Ollama's
    `{"error": "text", "error_type": …}`, Google's list of one error object. None when the
    body is not such JSON."""
    if len(body) > SCANNED_BYTES:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0]
    if not isinstance(value, dict):
        return None
    error = value.get("error")
    if isinstance(error, dict):
        return ErrorFields(_text(error.get("type")), _text(error.get("code")),
                           _text(error.get("message")))
    if isinstance(error, str):
        return ErrorFields(_text(value.get("error_type")), "", error.lower())
    return ErrorFields(_text(value.get("type")), _text(value.get("code")),
                       _text(value.get("message")))


def _matches(entry: Refusal, fields: ErrorFields) -> bool:
    return ((entry.error_type is None or fields.error_type == entry.error_type.lower())
            and (entry.error_code is None or fields.error_code == entry.error_code.lower())
            and (entry.phrase is None or entry.phrase.lower() in fields.message))


def refusal_of(status: int, body: bytes) -> Refusal | None:
    """The first catalogue entry the reply matches, or None."""
    if status not in REFUSAL_STATUSES:
        return None
    fields = error_fields(body)
    if fields is None:
        return None
    for entry in CATALOGUE:
        if entry.status == status and _matches(entry, fields):
            return entry
    return None


def is_context_refusal(status: int, body: bytes) -> bool:
    entry = refusal_of(status, body)
    return entry is not None and entry.verdict is Verdict.NEXT_TARGET


def token(value: str) -> str:
    """A type or code as it may appear in a header or a log line."""
    return _TOKEN.sub("", value)[:MAX_TOKEN_CHARS]


def unrecognised_mark(status: int, body: bytes) -> str | None:
    """For a refusal status no entry matches: what the access log may say of it (`type=…;
    code=…`, tokens only, empty when the body is not JSON); None when the reply is known
    or its status is not a refusal's."""
    if status not in REFUSAL_STATUSES or refusal_of(status, body) is not None:
        return None
    fields = error_fields(body) or ErrorFields()
    return f"type={token(fields.error_type)};code={token(fields.error_code)}"
