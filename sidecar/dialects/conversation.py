"""The conversation-affinity key of a request: SHA-256 over its normalized opening.

Recipe (docs/affinity.md): canonical JSON of
``{"v": 1, "caller", "group", "dialect", "system": [parts], "first": {"role", "content": [parts]}}``
with sorted keys and no insignificant whitespace, hashed with SHA-256. Only the 32-byte digest
leaves this module; the text it was computed from is dropped with the request.

Normalization, so that equivalent encodings give the same key:
- content given as a string is one text part: ``"hi"`` ≡ ``[{"type": "text", "text": "hi"}]``;
  empty text parts are dropped;
- parts keep only what identifies them: text → ``{"type": "text", "text"}``; images (OpenAI
  `image_url`, Responses `input_image`, Anthropic `image`) → ``{"type": "image", "source"}``;
  any other part → itself, keys sorted, `cache_control` markers removed;
- the system context is the leading `system`/`developer` messages (OpenAI Chat, Responses
  `input`), the top-level `system` (Anthropic) or `instructions` (Responses), as parts;
- the first message is the first non-system message: role, parts, and its `tool_calls`,
  `tool_call_id` or `function_call`; requests without messages (Responses `input`) use the
  first non-system input item (a non-message item whole), or the input string as one user
  text part;
- strings longer than 1,024 characters enter as their own SHA-256 (images are not copied).
The dialect stays in the key, so the same conversation in two dialects never shares a pin.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sidecar.dialects.apis import Dialect

_SYSTEM_ROLES = ("system", "developer")


# Strings longer than this enter the key as their own SHA-256 (a data-URL image is hashed
# once, not copied into a canonical document), over their length and every character: the
# SPEC's key is over the complete first message. Hashed in slices of `_SLICE` characters,
# so a long string is never copied whole into bytes (a 1 MB opening costs about 1 ms,
# bench/affinity_key_cost.py; the body it came in is bounded by the request-body limit).
_LONG = 1024
_SLICE = 64 * 1024
# The canonical JSON encoder, built once (`json.dumps` with these options builds one per call).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _compact(value: Any) -> Any:
    """Long strings → their digest; `cache_control` markers (moved between turns by
    clients) dropped at every level."""
    if isinstance(value, str):
        if len(value) <= _LONG:
            return value
        return {"sha256": _long_string_digest(value)}
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


def _long_string_digest(value: str) -> str:
    """SHA-256 of the length and the UTF-8 of the whole string (lone surrogates, which JSON
    escapes can carry, pass through: slicing between code points changes no byte)."""
    digest = hashlib.sha256(str(len(value)).encode())
    for start in range(0, len(value), _SLICE):
        digest.update(value[start:start + _SLICE].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _part(part: Any) -> Any:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        image = part.get("image_url")
        return {"type": "image",
                "source": image.get("url") if isinstance(image, dict) else image}
    if kind == "input_image":
        return {"type": "image", "source": part.get("image_url") or part.get("file_id")}
    if kind == "image":
        return {"type": "image", "source": part.get("source")}
    return part


def _parts(content: Any) -> list[Any]:
    """Normalized parts; empty text parts carry nothing and are dropped."""
    items = content if isinstance(content, list) else [] if content is None else [content]
    return [part for part in map(_part, items)
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and part.get("text") == "")]


def _message(item: dict[str, Any]) -> dict[str, Any]:
    """A first message: role and parts, plus the tool fields that make it what it is."""
    message: dict[str, Any] = {"role": item.get("role"), "content": _parts(item.get("content"))}
    for extra in ("tool_calls", "tool_call_id", "function_call"):
        if item.get(extra) is not None:
            message[extra] = item[extra]
    return message


def _opening(dialect: Dialect, payload: dict[str, Any]) -> tuple[list[Any], Any] | None:
    """(system parts, first message) or None when the request has no conversation."""
    if dialect is Dialect.OPENAI_RESPONSES:
        system = _parts(payload.get("instructions"))
        items = payload.get("input")
        if isinstance(items, str):
            return system, {"role": "user", "content": _parts(items)}
        if not isinstance(items, list):
            return None
        for item in items:
            if not isinstance(item, dict):
                return None
            if item.get("role") in _SYSTEM_ROLES:   # system context, like `instructions`
                system += _parts(item.get("content"))
                continue
            if "role" in item:
                return system, _message(item)
            return system, item                     # a non-message item, kept whole
        return None
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return None
    system = _parts(payload.get("system")) if dialect is Dialect.ANTHROPIC_MESSAGES else []
    for message in messages:
        if not isinstance(message, dict):
            return None
        role = message.get("role")
        if dialect is Dialect.OPENAI_CHAT and role in _SYSTEM_ROLES:
            system += _parts(message.get("content"))
            continue
        return system, _message(message)
    return None


def conversation_key(caller: str, group: str, dialect: Dialect,
                     payload: dict[str, Any]) -> bytes | None:
    opening = _opening(dialect, payload)
    if opening is None:
        return None
    system, first = opening
    try:
        document = {"v": 1, "caller": caller, "group": group, "dialect": dialect.value,
                    "system": _compact(system), "first": _compact(first)}
        canonical = _CANONICAL.encode(document)
    except (TypeError, ValueError, RecursionError):  # odd or absurdly deep: no affinity
        return None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()
