"""`GET /v1/models` bodies: the caller's model groups in the OpenAI or Anthropic list shape."""

from __future__ import annotations

import json
from collections.abc import Sequence

_EPOCH = "1970-01-01T00:00:00Z"


def model_list(groups: Sequence[str], anthropic: bool) -> bytes:
    if anthropic:
        payload: dict[str, object] = {
            "data": [_anthropic_model(name) for name in groups],
            "has_more": False,
            "first_id": groups[0] if groups else None,
            "last_id": groups[-1] if groups else None,
        }
    else:
        payload = {"object": "list", "data": [_openai_model(name) for name in groups]}
    return json.dumps(payload, separators=(",", ":")).encode()


def single_model(group: str, anthropic: bool) -> bytes:
    payload = _anthropic_model(group) if anthropic else _openai_model(group)
    return json.dumps(payload, separators=(",", ":")).encode()


def _openai_model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "model-group"}


def _anthropic_model(name: str) -> dict[str, object]:
    return {"type": "model", "id": name, "display_name": name, "created_at": _EPOCH}
