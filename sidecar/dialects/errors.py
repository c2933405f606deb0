"""Client-facing errors, rendered in the caller's own dialect.

OpenAI SDKs expect ``{"error": {"message", "type", "param", "code"}}``; Anthropic SDKs expect
``{"type": "error", "error": {"type", "message"}}``. Both map the HTTP status to an exception
class, so the status matters as much as the body. Messages must never quote a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True, slots=True)
class ClientError:
    status: int
    message: str
    code: str | None = None
    param: str | None = None

    def render(self, anthropic: bool) -> bytes:
        if anthropic:
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
            payload: dict[str, object] = {
                "type": "error",
                "error": {"type": kind, "message": self.message},
            }
        else:
            kind = ("server_error" if self.status >= 500 else "rate_limit_exceeded"
                    if self.status == 429 else "invalid_request_error")
            payload = {
                "error": {
                    "message": self.message,
                    "type": kind,
                    "param": self.param,
                    "code": self.code,
                }
            }
        return json.dumps(payload, separators=(",", ":")).encode()


def missing_token() -> ClientError:
    return ClientError(
        401,
        "Missing API key. Send your caller token as 'Authorization: Bearer <token>' "
        "or 'x-api-key: <token>'.",
        code="invalid_api_key",
    )


def unknown_token() -> ClientError:
    return ClientError(401, "Invalid API key: this caller token is not known.",
                       code="invalid_api_key")


def model_not_found(model: str) -> ClientError:
    return ClientError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )
