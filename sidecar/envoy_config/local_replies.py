"""Envoy's own error replies, rewritten as JSON errors in the caller's dialect.

When Envoy answers by itself (sidecar unreachable or too slow, upstream connect failure,
upstream timeout, body over the buffer limit, a request it refuses as malformed) its
default body is plain text, sometimes empty. These mappers wrap it in the OpenAI or
Anthropic error shape so SDKs raise their ordinary exceptions; the status is Envoy's.
Replies the sidecar itself decided (ext_proc immediate responses, `details: sidecar_reply`)
are already in the right shape and are left alone; that is done with a CEL filter on
`response.code_details`, measured on Envoy 1.40.

The dialect follows the sidecar's rule (gateway/handler.py): the path first (`…/messages`
is Anthropic, `…/chat/completions` and `…/responses` OpenAI, a `#fragment` ignored), then
the `anthropic-version` header, then OpenAI. After routing the path is the provider's
(base path + the same endpoint), so the rule still holds — except in groups with bridges,
where the target's endpoint may be another API's: there the caller's API marker
(`x-sidecar-caller-api`, set by the decision) decides.

Envoy's HTTP/1 codec refuses some requests before the connection manager has any header
(oversized or invalid headers, an invalid request line, HTTP/1.0, an unknown transfer
coding): there the dialect cannot be known, and the body is both shapes at once,
``{"type": "error", "error": {"type", "message", "param", "code"}}``, which the OpenAI SDK
reads through `error` and the Anthropic SDK through `type` + `error`. Unknown or lowercase
methods are not refused by the codec at all (`client_http1_options`): they reach the
sidecar, which answers 405 (or 401) in the caller's dialect. docs/architecture.md lists
which statuses come from Envoy.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLogFilter, ExtensionFilter
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    Http1ProtocolOptions,
    SubstitutionFormatString,
)
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.google.protobuf import Any, Struct

from sidecar.dialects.apis import CALLER_PATHS, Dialect
from sidecar.envoy_contract import CALLER_API_HEADER, SIDECAR_REPLY_DETAILS

SIDECAR_UNAVAILABLE = "The routing sidecar is unavailable or too slow; try again shortly."
# Codec refusals: Envoy's status text ("Bad Request") and its details ("http1.invalid_url").
UNPARSED_MESSAGE = "HTTP request rejected: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)"
_SERVED = ", ".join(sorted([*CALLER_PATHS, "/v1/models"]))


@dataclass(frozen=True, slots=True)
class EnvoyRefusal:
    """A reply Envoy's connection manager makes with an empty body, and the words for it."""

    details: str
    status: int
    message: str


# Measured on Envoy 1.40 (tests/e2e/test_envoy_replies.py); each has the request headers.
EMPTY_BODY_REFUSALS = (
    EnvoyRefusal("path_normalization_failed", 400,
                 "The request path is not accepted: it has a '#fragment' or cannot be "
                 "normalized."),
    EnvoyRefusal("absolute_path_rejected", 404,
                 f"Unknown endpoint: the request target must be a path; this gateway "
                 f"serves {_SERVED}"),
    EnvoyRefusal("missing_host_header", 400, "The request has no Host header."),
    EnvoyRefusal("upgrade_failed", 403,
                 "Connection upgrades (such as WebSocket) are not supported."),
)

# CEL `request.url_path` is the path without the query, but with any #fragment.
_ANTHROPIC_PATH = "request.url_path.matches('^[^#]*/messages(#|$)')"
_OPENAI_PATH = "request.url_path.matches('^[^#]*/(chat/completions|responses)(#|$)')"
_BY_PATH = (f"({_ANTHROPIC_PATH} || "
            f"(!{_OPENAI_PATH} && 'anthropic-version' in request.headers))")
# In a group with bridges the path after routing is the *target's* (an OpenAI caller's
# request to an Anthropic target ends in /messages); the caller's API marker, which the
# router-level decision sets there, says whose dialect the caller reads.
_ANTHROPIC = (f"('{CALLER_API_HEADER}' in request.headers ? "
              f"request.headers['{CALLER_API_HEADER}'] == '{Dialect.ANTHROPIC_MESSAGES.value}' "
              f": {_BY_PATH})")
# An HTTP/1 codec error before the headers were complete: the stream has no header at all.
_UNPARSED = "size(request.headers) == 0"
_NOT_SIDECAR = f'response.code_details != "{SIDECAR_REPLY_DETAILS}"'
_SIDECAR_FAILED = 'response.code_details.startsWith("ext_proc_error")'


def client_http1_options() -> Http1ProtocolOptions:
    """The listener's HTTP/1 codec. With custom methods allowed, any token method (`get`,
    `FOO`) reaches the sidecar and gets its 405 in the caller's dialect; without it the
    codec refuses the request line with a 400 before any header is read."""
    return Http1ProtocolOptions(allow_custom_methods=True)


def anthropic_type(status: int) -> str:
    return {403: "permission_error", 404: "not_found_error", 413: "request_too_large",
            429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500
                                         else "api_error")


def openai_type(status: int) -> str:
    if status == 429:
        return "rate_limit_exceeded"
    return "invalid_request_error" if status < 500 else "server_error"


def _cel(expression: str) -> AccessLogFilter:
    return AccessLogFilter(
        extension_filter=ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=Any.pack(ExpressionFilter(expression=expression)),
        )
    )


def _openai_error(kind: str, message: str) -> dict:
    return {"message": message, "type": kind, "param": None, "code": "gateway_%RESPONSE_CODE%"}


def _openai_body(kind: str) -> SubstitutionFormatString:
    return SubstitutionFormatString(json_format=Struct.from_dict(
        {"error": _openai_error(kind, "%LOCAL_REPLY_BODY%")}))


def _anthropic_body(kind: str) -> SubstitutionFormatString:
    return SubstitutionFormatString(json_format=Struct.from_dict({
        "type": "error",
        "error": {"type": kind, "message": "%LOCAL_REPLY_BODY%"},
    }))


def _both_body(kind: str) -> SubstitutionFormatString:
    """Both shapes in one: Anthropic's `type` + `error`, with OpenAI's fields inside."""
    return SubstitutionFormatString(json_format=Struct.from_dict(
        {"type": "error", "error": _openai_error(kind, UNPARSED_MESSAGE)}))


def _in_dialect(condition: str, anthropic_kind: str, openai_kind: str,
                body: DataSource | None = None) -> list[ResponseMapper]:
    return [
        ResponseMapper(filter=_cel(f"{condition} && {_ANTHROPIC}"), body=body,
                       body_format_override=_anthropic_body(anthropic_kind)),
        ResponseMapper(filter=_cel(condition), body=body,
                       body_format_override=_openai_body(openai_kind)),
    ]


def _by_status(condition: str, status: int) -> list[ResponseMapper]:
    return _in_dialect(f"{condition} && response.code == {status}",
                       anthropic_type(status), openai_type(status))


def local_reply_config() -> LocalReplyConfig:
    """Mappers are tried in order; the first whose filter matches rewrites the reply."""
    unavailable = DataSource(inline_string=SIDECAR_UNAVAILABLE)
    refusals = [
        mapper for refusal in EMPTY_BODY_REFUSALS for mapper in _in_dialect(
            f'response.code_details == "{refusal.details}" && response.code == {refusal.status}',
            anthropic_type(refusal.status), openai_type(refusal.status),
            DataSource(inline_string=refusal.message))
    ]
    return LocalReplyConfig(mappers=[
        *_in_dialect(_SIDECAR_FAILED, "api_error", "server_error", unavailable),
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {_UNPARSED} && response.code < 500"),
                       body_format_override=_both_body("invalid_request_error")),
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {_UNPARSED}"),
                       body_format_override=_both_body("api_error")),
        *refusals,
        # 413: a body over the buffer limit. 429: a final provider 429, rewritten by the
        # custom-response filter (upstream_errors.py).
        *(mapper for status in (403, 404, 413, 429)
          for mapper in _by_status(_NOT_SIDECAR, status)),
        *_in_dialect(f"{_NOT_SIDECAR} && response.code < 500",
                     "invalid_request_error", "invalid_request_error"),
        *_in_dialect(_NOT_SIDECAR, "api_error", "server_error"),
    ])
