"""Build Envoy ext_proc responses (upb-backed protobuf messages) from gateway outcomes.

Facts this relies on (measured on Envoy 1.40, see ARCHITECTURE.md): header values must be
set through `raw_value`; a routing header takes effect only with `clear_route_cache`; a
body mutation needs a matching `content-length`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3.http_status_pb2 import HttpStatus

from sidecar.envoy_contract import ROUTE_HEADER, SIDECAR_REPLY_DETAILS
from sidecar.gateway.outcome import Forward, Reply

_OVERWRITE = HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(message: ext.HttpHeaders) -> dict[str, str]:
    """Flatten Envoy's header list into a lower-case dict (last value wins)."""
    headers: dict[str, str] = {}
    for header in message.headers.headers:
        headers[header.key] = header.raw_value.decode("utf-8", "replace") or header.value
    return headers


def _set(headers: Iterable[tuple[str, str]]) -> list[HeaderValueOption]:
    return [
        HeaderValueOption(header=HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE)
        for k, v in headers
    ]


def continue_headers(headers: Mapping[str, str]) -> ext.ProcessingResponse:
    """Let the headers pass, minus what a caller must not control: the routing header and
    Envoy's x-envoy-* control headers (retry counts, timeouts), which the router would obey.
    Envoy trusts those from "internal" (e.g. loopback) clients even as an edge proxy."""
    remove = [ROUTE_HEADER, *(name for name in headers if name.startswith("x-envoy-"))]
    return ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(
            response=ext.CommonResponse(header_mutation=ext.HeaderMutation(remove_headers=remove))
        )
    )


def immediate(reply: Reply) -> ext.ProcessingResponse:
    headers = {"content-type": reply.content_type}
    return ext.ProcessingResponse(
        immediate_response=ext.ImmediateResponse(
            status=HttpStatus(code=reply.status),  # type: ignore[arg-type]
            headers=ext.HeaderMutation(set_headers=_set(headers.items())),
            body=reply.body,
            details=SIDECAR_REPLY_DETAILS,
        )
    )


def forward(outcome: Forward) -> ext.ProcessingResponse:
    return ext.ProcessingResponse(
        request_body=ext.BodyResponse(
            response=ext.CommonResponse(
                header_mutation=ext.HeaderMutation(
                    set_headers=_set(outcome.set_headers),
                    remove_headers=list(outcome.remove_headers),
                ),
                body_mutation=ext.BodyMutation(body=outcome.body),
                clear_route_cache=True,
            )
        )
    )
