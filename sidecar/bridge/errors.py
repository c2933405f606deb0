"""An upstream error in the target's dialect, rewritten in the caller's (docs/dialects.md
§5): the status kept (529 becomes 503 for OpenAI callers, who have no 529), the message kept
except for 401 and 403, where a provider may quote part of its key."""

from __future__ import annotations

import json

from sidecar.dialects.apis import Dialect
from sidecar.dialects.errors import ClientError

CREDENTIALS_REJECTED = ("The provider rejected the gateway's credentials for this target "
                        "(an operator's configuration issue, not the caller's).")
_MAX_MESSAGE = 2000


def translated_error(status: int, body: bytes, caller: Dialect) -> tuple[int, bytes]:
    """The caller's status and JSON body for an upstream error answer."""
    if not caller.is_anthropic and status == 529:
        status = 503
    if status in (401, 403):
        message = CREDENTIALS_REJECTED
    else:
        message = upstream_message(body) or f"The provider answered with status {status}."
    error = ClientError(status, message[:_MAX_MESSAGE])
    return status, error.render(caller.is_anthropic)


def upstream_message(body: bytes) -> str | None:
    """The message of an OpenAI- or Anthropic-shaped error body, if it has one."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    error = document.get("error") if isinstance(document, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None
