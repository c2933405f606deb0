"""Envoy's own error replies, rewritten as JSON errors in the caller's dialect.

When Envoy answers by itself (sidecar unreachable or too slow, upstream connect failure,
upstream timeout, body over the buffer limit) its default body is plain text. These mappers
wrap it in the OpenAI or Anthropic error shape, chosen by the request path, so SDKs raise
their ordinary exceptions. Replies the sidecar itself decided (ext_proc immediate responses,
`details: sidecar_reply`) are already in the right shape and are left alone; that is done
with a CEL filter on `response.code_details`, measured on Envoy 1.40.
"""

from __future__ import annotations

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLogFilter, ExtensionFilter
from envoy_data_plane.envoy.config.core.v3 import DataSource, SubstitutionFormatString
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.google.protobuf import Any, Struct

from sidecar.envoy_contract import SIDECAR_REPLY_DETAILS

SIDECAR_UNAVAILABLE = "The routing sidecar is unavailable or too slow; try again shortly."

# The caller's path (/v1/messages) or, once the sidecar routed the request, the provider's
# (…/v1/messages, under whatever base path the provider has); never with the query string.
_ANTHROPIC_PATH = 'request.url_path.endsWith("/messages")'
_NOT_SIDECAR = f'response.code_details != "{SIDECAR_REPLY_DETAILS}"'
_SIDECAR_FAILED = 'response.code_details.startsWith("ext_proc_error")'


def _cel(expression: str) -> AccessLogFilter:
    return AccessLogFilter(
        extension_filter=ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=Any.pack(ExpressionFilter(expression=expression)),
        )
    )


def _openai_body(kind: str) -> SubstitutionFormatString:
    return SubstitutionFormatString(json_format=Struct.from_dict({"error": {
        "message": "%LOCAL_REPLY_BODY%",
        "type": kind,
        "param": None,
        "code": "gateway_%RESPONSE_CODE%",
    }}))


def _anthropic_body(kind: str) -> SubstitutionFormatString:
    return SubstitutionFormatString(json_format=Struct.from_dict({
        "type": "error",
        "error": {"type": kind, "message": "%LOCAL_REPLY_BODY%"},
    }))


def local_reply_config() -> LocalReplyConfig:
    """Mappers are tried in order; the first whose filter matches rewrites the reply."""
    unavailable = DataSource(inline_string=SIDECAR_UNAVAILABLE)
    too_large = "response.code == 413"
    rate_limited = "response.code == 429"
    return LocalReplyConfig(mappers=[
        ResponseMapper(filter=_cel(f"{_SIDECAR_FAILED} && {_ANTHROPIC_PATH}"),
                       body=unavailable, body_format_override=_anthropic_body("api_error")),
        ResponseMapper(filter=_cel(_SIDECAR_FAILED),
                       body=unavailable, body_format_override=_openai_body("server_error")),
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {too_large} && {_ANTHROPIC_PATH}"),
                       body_format_override=_anthropic_body("request_too_large")),
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {too_large}"),
                       body_format_override=_openai_body("invalid_request_error")),
        # A final provider 429 (rewritten by the custom-response filter, upstream_errors.py)
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {rate_limited} && {_ANTHROPIC_PATH}"),
                       body_format_override=_anthropic_body("rate_limit_error")),
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {rate_limited}"),
                       body_format_override=_openai_body("rate_limit_exceeded")),
        ResponseMapper(filter=_cel(f"{_NOT_SIDECAR} && {_ANTHROPIC_PATH}"),
                       body_format_override=_anthropic_body("api_error")),
        ResponseMapper(filter=_cel(_NOT_SIDECAR),
                       body_format_override=_openai_body("server_error")),
    ])
