"""The API dialects the sidecar understands, and where each one lives on the wire.

A dialect is both what a caller speaks (by the path it calls) and what a provider speaks
natively. Routing only ever pairs a caller with a target of the same dialect until the
cross-dialect bridges exist, so this enum is shared by configuration, routing and Envoy glue.
"""

from __future__ import annotations

from enum import StrEnum

# The Messages API version the gateway sends when a caller (or a bridge) gives none.
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"


class Dialect(StrEnum):
    OPENAI_CHAT = "openai_chat"
    OPENAI_RESPONSES = "openai_responses"
    ANTHROPIC_MESSAGES = "anthropic_messages"

    @property
    def endpoint(self) -> str:
        """Path of this dialect's generation endpoint, relative to a provider's versioned
        base URL (``https://api.openai.com/v1`` + ``/chat/completions``)."""
        return _ENDPOINTS[self]

    @property
    def is_anthropic(self) -> bool:
        return self is Dialect.ANTHROPIC_MESSAGES


_ENDPOINTS = {
    Dialect.OPENAI_CHAT: "/chat/completions",
    Dialect.OPENAI_RESPONSES: "/responses",
    Dialect.ANTHROPIC_MESSAGES: "/messages",
}

# Caller-facing paths (the SDKs' defaults) to the dialect they speak.
CALLER_PATHS: dict[str, Dialect] = {
    "/v1" + endpoint: dialect for dialect, endpoint in _ENDPOINTS.items()
}
