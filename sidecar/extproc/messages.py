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
from google.protobuf.struct_pb2 import Struct

from sidecar.envoy_contract import CLUSTER_ATTRIBUTE, ROUTE_NAMESPACE, SIDECAR_REPLY_DETAILS
from sidecar.gateway.outcome import Forward, Reply, Retarget

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


def attempt_cluster(request: ext.ProcessingRequest) -> str | None:
    """The target cluster of a per-attempt (retry) stream; None for a router-level stream,
    which asks Envoy for no attributes."""
    for attributes in request.attributes.values():
        value = attributes.fields.get(CLUSTER_ATTRIBUTE)
        if value is not None:
            return value.string_value
    return None


def continue_headers(headers: Mapping[str, str]) -> ext.ProcessingResponse:
    """Let the headers pass, minus what a caller must not control: Envoy's x-envoy-*
    control headers (retry counts, timeouts), which the router would obey. Envoy trusts
    those from "internal" (e.g. loopback) clients even as an edge proxy."""
    remove = [name for name in headers if name.startswith("x-envoy-")]
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


_ORDERS: dict[tuple[str, ...], Struct] = {}
_ORDERS_MAX = 4096


def attempt_order(clusters: tuple[str, ...]) -> Struct:
    """Dynamic metadata for Envoy's priority-group cluster specifier: one group per attempt,
    one cluster per group. Orders repeat a lot, so built messages are kept (bounded)."""
    order = _ORDERS.get(clusters)
    if order is None:
        if len(_ORDERS) >= _ORDERS_MAX:
            _ORDERS.clear()
        order = Struct()
        order.update({ROUTE_NAMESPACE: {"priority_groups": [
            {"name": f"attempt{n}", "clusters": [{"cluster_name": cluster, "weight": 1}]}
            for n, cluster in enumerate(clusters, 1)]}})
        _ORDERS[clusters] = order
    return order


def _body_response(set_headers: Iterable[tuple[str, str]], remove_headers: Iterable[str],
                   body: bytes, clear_route_cache: bool = False) -> ext.ProcessingResponse:
    """Answer to a buffered request body: header changes and the new body.

    Built by assigning into nested fields: passing a sub-message to a constructor copies it
    (with upb, through a serialize/parse round), which for a 1 MiB body cost milliseconds."""
    response = ext.ProcessingResponse()
    common = response.request_body.response
    common.header_mutation.set_headers.extend(_set(set_headers))
    common.header_mutation.remove_headers.extend(remove_headers)
    common.body_mutation.body = body
    common.clear_route_cache = clear_route_cache
    return response


def forward(outcome: Forward) -> ext.ProcessingResponse:
    """Rewrite for the primary and hand Envoy the attempt order; the route is resolved
    again (clear_route_cache) so the cluster specifier reads it."""
    response = _body_response(outcome.set_headers, outcome.remove_headers, outcome.body,
                              clear_route_cache=True)
    response.dynamic_metadata.CopyFrom(attempt_order(outcome.attempts))
    return response


def continue_attempt() -> ext.ProcessingResponse:
    return ext.ProcessingResponse(request_headers=ext.HeadersResponse())


def retarget(outcome: Retarget) -> ext.ProcessingResponse:
    """Header mutations made here stay on the request for later attempts, so every
    per-target header is set or removed on every retry (ARCHITECTURE.md)."""
    return _body_response(outcome.set_headers, outcome.remove_headers, outcome.body)
