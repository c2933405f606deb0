"""Whether a provider's 2xx is what its dialect promises, judged from what Envoy logged.

Envoy's usage readers (json_to_metadata for JSON replies, sse_to_metadata for event streams;
envoy_config/observation_filters.py), and the sidecar for the replies of undeclared length
it reads at the reply gate (reply_reading.py), leave a few facts in the `sidecar.usage`
dynamic metadata, and the access log carries the response's
content type and encoding. From those alone:

| a 2xx with … | verdict |
| --- | --- |
| an error object (`error.type` or `error.code`, in a JSON body or an SSE event) | invalid |
| a content type that is neither JSON nor an event stream (HTML, plain text) | invalid |
| a JSON body that does not parse, or is empty | invalid |
| a JSON body with neither usage nor a completion's `object`/`type` | invalid |
| an event stream without a single event of either dialect's shape (`object`/`type`) | invalid |
| an Anthropic stream (first event `message_start`) with an event whose data is not JSON | invalid |
| a JSON body that was not read (longer than the held limits) | valid |
| a compressed body (Envoy's readers cannot read it), or no content type at all | valid |

A valid-looking body is not proof of a good completion; the checks catch what providers
and their load balancers actually send instead of one.
"""

from __future__ import annotations

from collections.abc import Container

from sidecar.envoy_contract import USAGE_KEY

# Keys the usage readers write in the usage namespace (next to the output tokens).
ERROR_TYPE_KEY = "error_type"       # the provider's `error.type` (or `error.code`)
NOT_JSON_KEY = "not_json"           # a JSON reply's body did not parse
NOT_JSON = "true"
NOT_JSON_EVENT_KEY = "not_json_event"  # some event of a stream did not parse (OpenAI's
#                                        `[DONE]` among them: read for Anthropic streams only)
USAGE_MISSING_KEY = "usage_missing"  # a JSON reply was parsed and one usage path was absent
USAGE_MISSING = "true"
SHAPE_KEY = "shape"                 # a reply's or an SSE event's `object` (OpenAI) or
#                                     `type` (Anthropic)

# Response headers the access log carries for these checks.
CONTENT_TYPE = "content-type"
CONTENT_ENCODING = "content-encoding"
LOGGED_RESPONSE_HEADERS = (CONTENT_TYPE, CONTENT_ENCODING)

# The first event of an Anthropic stream (docs.anthropic.com/en/api/messages-streaming).
_ANTHROPIC_STREAM_STARTS = frozenset({"message_start", "ping"})
_JSON = "application/json"
_EVENT_STREAM = "text/event-stream"


def invalid_body(content_type: str, content_encoding: str, usage: Container[str],
                 shape: str = "") -> bool:
    """For a 2xx: True when the body is not what a completion of either dialect looks like.
    `usage` holds the keys present in the usage metadata (output tokens included), `shape`
    the value of its SHAPE_KEY."""
    if ERROR_TYPE_KEY in usage:
        return True
    if content_encoding.strip().lower() not in ("", "identity"):
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    if not media_type:
        return False
    if media_type == _JSON:
        if NOT_JSON_KEY in usage:
            return True
        return (USAGE_MISSING_KEY in usage and USAGE_KEY not in usage
                and SHAPE_KEY not in usage)
    if media_type == _EVENT_STREAM:
        if NOT_JSON_EVENT_KEY in usage and shape in _ANTHROPIC_STREAM_STARTS:
            return True
        return SHAPE_KEY not in usage and USAGE_KEY not in usage
    return True
