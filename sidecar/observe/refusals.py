"""A provider's refusal that another target of the group may not share: the prompt is too
long for this model's context window. Read where a reply is held before the router commits
(the hold's Lua, envoy_config/upstream_errors.py; the reply gate, gateway/reply_gate.py),
so the request goes on to the next target instead of back to the caller.

The phrases are the providers' own (their documentation names them; the fake providers
send them, devstack/provider_wire.py): OpenAI's error code `context_length_exceeded`,
Anthropic's "prompt is too long: N tokens > M maximum", vLLM's and many OpenAI-compatible
servers' "maximum context length". Only a 400's first `SCANNED_BYTES` are read.
"""

from __future__ import annotations

CONTEXT_LENGTH_PHRASES = ("context_length_exceeded", "prompt is too long",
                          "maximum context length")
SCANNED_BYTES = 4096


def is_context_refusal(status: int, body: bytes) -> bool:
    if status != 400:
        return False
    text = body[:SCANNED_BYTES].decode("utf-8", "replace").lower()
    return any(phrase in text for phrase in CONTEXT_LENGTH_PHRASES)
