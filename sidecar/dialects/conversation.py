"""The conversation-affinity key of a request: SHA-256 over its normalized opening.

Recipe (docs/affinity.md): canonical JSON of
``{"v": 1, "caller", "group", "dialect", "system": [parts], "first": {"role", "content": [parts]}}``
with sorted keys and no insignificant whitespace, hashed with SHA-256. Only the 32-byte digest
leaves this module; the text it was computed from is dropped with the request.

Normalization, so that equivalent encodings give the same key:
- content given as a string is one text part: ``"hi"`` ≡ ``[{"type": "text", "text": "hi"}]``;
- parts keep only what identifies them: text → ``{"type": "text", "text"}``; images (OpenAI
  `image_url`, Responses `input_image`, Anthropic `image`) → ``{"type": "image", "source"}``;
  any other part → itself, keys sorted;
- the system context is the text of the leading `system`/`developer` messages (OpenAI Chat),
  the top-level `system` (Anthropic) or `instructions` (Responses), as parts;
- the first message is the first non-system message; requests without messages (Responses
  `input`) use the first input item, or the input string as one user text part.
The dialect stays in the key, so the same conversation in two dialects never shares a pin.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sidecar.apis import Dialect

_SYSTEM_ROLES = ("system", "developer")


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
    if content is None:
        return []
    if isinstance(content, list):
        return [_part(item) for item in content]
    return [_part(content)]


def _opening(dialect: Dialect, payload: dict[str, Any]) -> tuple[list[Any], Any] | None:
    """(system parts, first message) or None when the request has no conversation."""
    if dialect is Dialect.OPENAI_RESPONSES:
        system = _parts(payload.get("instructions"))
        items = payload.get("input")
        if isinstance(items, str):
            return system, {"role": "user", "content": _parts(items)}
        if isinstance(items, list) and items and isinstance(items[0], dict):
            first = items[0]
            return system, {"role": first.get("role", "user"),
                            "content": _parts(first.get("content"))}
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
        return system, {"role": role, "content": _parts(message.get("content"))}
    return None


def conversation_key(caller: str, group: str, dialect: Dialect,
                     payload: dict[str, Any]) -> bytes | None:
    opening = _opening(dialect, payload)
    if opening is None:
        return None
    system, first = opening
    document = {"v": 1, "caller": caller, "group": group, "dialect": dialect.value,
                "system": system, "first": first}
    try:
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False)
    except (TypeError, ValueError):  # unsortable mixed keys and the like: no affinity
        return None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()
