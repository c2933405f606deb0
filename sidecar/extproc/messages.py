"""Build Envoy ext_proc responses (upb-backed protobuf messages) from gateway outcomes.

Facts this relies on (measured on Envoy 1.40, see ARCHITECTURE.md): header values must be
set through `raw_value`; a routing header takes effect only with `clear_route_cache`; a
body mutation needs a matching `content-length`.

A large body answer (from 64 KiB) leaves its body out of the protobuf message and is sent
as that message's bytes followed by the body field's own encoding (`BodyAnswer`): protobuf
merges a repeated embedded message, so Envoy parses the two as one answer, and a 1 MB body
is framed straight from the pieces it arrived in instead of being joined, copied into the
message, serialized and copied again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3.base_pb2 import HeaderValueOption, Metadata
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from sidecar.envoy_contract import (
    CLUSTER_ATTRIBUTE,
    FIRST_EVENT_DEADLINE_KEY,
    ROUTE_NAMESPACE,
    SAME_TARGET_KEY,
    SAME_TARGET_WAIT_KEY,
    SIDECAR_REPLY_DETAILS,
    USAGE_NAMESPACE,
)
from sidecar.gateway.attempt_orders import AttemptOrder
from sidecar.gateway.bridging import Rewrite
from sidecar.gateway.outcome import BodyParts, Forward, Reply, Retarget, body_size

_OVERWRITE = HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(message: ext.HttpHeaders) -> dict[str, str]:
    """Flatten Envoy's header list into a lower-case dict (last value wins)."""
    headers: dict[str, str] = {}
    for header in message.headers.headers:
        headers[header.key] = header.raw_value.decode("utf-8", "replace") or header.value
    return headers


def _add_sets(target: Any, headers: Iterable[tuple[str, str]]) -> None:
    """Header sets added in place: building each option by its constructor and extending
    copies every option twice (a nested message passed to a constructor goes through a
    serialize/parse round with upb, and `extend` copies again) — on every request."""
    for key, value in headers:
        option = target.add()
        option.header.key = key
        option.header.raw_value = value.encode()
        option.append_action = _OVERWRITE


def attempt_cluster(request: ext.ProcessingRequest) -> str | None:
    """The target cluster of a per-attempt (retry) stream; None for a router-level stream,
    which asks Envoy for no attributes."""
    for attributes in request.attributes.values():
        value = attributes.fields.get(CLUSTER_ATTRIBUTE)
        if value is not None:
            return value.string_value
    return None


def continue_headers(headers: Mapping[str, str],
                     allowed: frozenset[str]) -> ext.ProcessingResponse:
    """Let the headers pass, minus everything not `allowed` (sidecar/header_policy.py):
    the caller's credentials, cookies and custom headers, and Envoy's x-envoy-* control
    headers (retry counts, timeouts), which the router would obey (Envoy trusts those from
    "internal", e.g. loopback, clients even as an edge proxy)."""
    remove = [name for name in headers if name not in allowed and name[:1] != ":"]
    return ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(
            response=ext.CommonResponse(header_mutation=ext.HeaderMutation(remove_headers=remove))
        )
    )


def immediate(reply: Reply) -> ext.ProcessingResponse:
    response = ext.ProcessingResponse()
    answer = response.immediate_response
    answer.status.code = reply.status  # type: ignore[assignment]
    _add_sets(answer.headers.set_headers,
              {"content-type": reply.content_type, **dict(reply.headers)}.items())
    answer.body = reply.body
    answer.details = SIDECAR_REPLY_DETAILS
    return response


_ORDERS: dict[AttemptOrder, bytes] = {}
_ORDERS_MAX = 4096


def attempt_order(order: AttemptOrder) -> bytes:
    """Dynamic metadata for Envoy's priority-group cluster specifier (one group per attempt,
    one cluster per group), as the encoding of a ProcessingResponse holding only it: sent
    after the rest of the answer, it parses as that answer's metadata (protobuf merges
    concatenated messages). Orders repeat a lot, so encodings are kept (bounded) and no
    request copies a Struct."""
    encoded = _ORDERS.get(order)
    if encoded is None:
        if len(_ORDERS) >= _ORDERS_MAX:
            _ORDERS.clear()
        holder = ext.ProcessingResponse()
        holder.dynamic_metadata.update({ROUTE_NAMESPACE: _priority_groups(order)})
        encoded = _ORDERS[order] = holder.SerializeToString()
    return encoded


def _priority_groups(order: AttemptOrder) -> dict:
    """The `sidecar.route` metadata: the priority groups the cluster specifier reads and,
    for a group with `retry_same_target`, how often a held 5xx or 429 may repeat a target
    and the longest `retry-after` of a 429 that may (the hold's Lua and the reply gate
    read them)."""
    groups: dict = {"priority_groups": [
        {"name": f"attempt{n}", "clusters": [{"cluster_name": cluster, "weight": 1}]}
        for n, cluster in enumerate(order.clusters, 1)]}
    if order.same_target_retries:
        groups[SAME_TARGET_KEY] = order.same_target_retries
        if order.same_target_wait_s:
            groups[SAME_TARGET_WAIT_KEY] = order.same_target_wait_s
    if order.first_event_deadline_s:
        groups[FIRST_EVENT_DEADLINE_KEY] = order.first_event_deadline_s
    return groups


def order_of(metadata: Metadata) -> AttemptOrder:
    """The attempt order (its clusters, and how often a target may repeat) from the
    `sidecar.route` metadata Envoy forwarded; empty when it is not there or not readable."""
    route = metadata.filter_metadata.get(ROUTE_NAMESPACE)
    if route is None or "priority_groups" not in route.fields:
        return AttemptOrder()
    clusters = []
    for group in route.fields["priority_groups"].list_value.values:
        entries = group.struct_value.fields.get("clusters")
        if entries is None or not entries.list_value.values:
            return AttemptOrder()
        name = entries.list_value.values[0].struct_value.fields.get("cluster_name")
        if name is None or not name.string_value:
            return AttemptOrder()
        clusters.append(name.string_value)
    repeats = route.fields.get(SAME_TARGET_KEY)
    wait = route.fields.get(SAME_TARGET_WAIT_KEY)
    deadline = route.fields.get(FIRST_EVENT_DEADLINE_KEY)
    return AttemptOrder(tuple(clusters), int(repeats.number_value) if repeats else 0,
                        wait.number_value if wait else 0.0,
                        deadline.number_value if deadline else 0.0)


def _field_number(message: type, name: str) -> int:
    return message.DESCRIPTOR.fields_by_name[name].number


# ProcessingResponse.request_body.response.body_mutation.body, outermost first.
_BODY_PATH = (
    _field_number(ext.ProcessingResponse, "request_body"),
    _field_number(ext.BodyResponse, "response"),
    _field_number(ext.CommonResponse, "body_mutation"),
    _field_number(ext.BodyMutation, "body"),
)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class BodyAnswer:
    """An answer to a buffered request body in wire pieces: `response` (header changes),
    then `metadata` (an encoded attempt order, `attempt_order`), then — when the body is
    not inside `response` — the new body's pieces behind its field's own encoding.
    `wire_parts` is what goes on the wire; `SerializeToString` joins it, for tests and
    tools."""

    __slots__ = ("body_parts", "metadata", "response")

    def __init__(self, response: ext.ProcessingResponse, body_parts: BodyParts = (),
                 metadata: bytes = b"") -> None:
        self.response = response
        self.body_parts = body_parts
        self.metadata = metadata

    def wire_parts(self) -> list[bytes | memoryview]:
        parts: list[bytes | memoryview] = [self.response.SerializeToString()]
        if self.metadata:
            parts.append(self.metadata)
        if not self.body_parts:
            return parts
        size = body_size(self.body_parts)
        heads = []
        for number in reversed(_BODY_PATH):  # each field wraps the one inside it
            head = _varint(number << 3 | 2) + _varint(size)
            heads.append(head)
            size += len(head)
        parts.append(b"".join(reversed(heads)))
        parts.extend(self.body_parts)
        return parts

    def SerializeToString(self) -> bytes:  # named like the protobuf method it stands in for
        return b"".join(self.wire_parts())


# Below this size a body goes inside the message: one bytes object is cheaper to frame than
# pieces, and copying a few KiB costs less than the pieces' bookkeeping.
_PIECES_FROM_BYTES = 64 * 1024


def _body_response(set_headers: Iterable[tuple[str, str]], remove_headers: Iterable[str],
                   body: BodyParts, order: AttemptOrder | None = None
                   ) -> ext.ProcessingResponse | BodyAnswer:
    """Answer to a buffered request body: header changes and the new body; with `order`,
    also the attempt order, and the route resolved again so the cluster specifier reads it.

    Built by assigning into nested fields: passing a sub-message to a constructor copies it
    (with upb, through a serialize/parse round)."""
    response = ext.ProcessingResponse()
    common = response.request_body.response
    _add_sets(common.header_mutation.set_headers, set_headers)
    common.header_mutation.remove_headers.extend(remove_headers)
    metadata = b""
    if order is not None:
        common.clear_route_cache = True
        metadata = attempt_order(order)
    if body_size(body) < _PIECES_FROM_BYTES:
        common.body_mutation.body = b"".join(body)
        return BodyAnswer(response, (), metadata) if metadata else response
    return BodyAnswer(response, body, metadata)


def forward(outcome: Forward) -> ext.ProcessingResponse | BodyAnswer:
    """Rewrite for the primary and hand Envoy the attempt order; the route is resolved
    again (clear_route_cache) so the cluster specifier reads it."""
    return _body_response(outcome.set_headers, outcome.remove_headers, outcome.body_parts,
                          AttemptOrder(outcome.attempts, outcome.same_target_retries,
                                       outcome.same_target_wait_s,
                                       outcome.first_event_deadline_s))


def continue_response_headers() -> ext.ProcessingResponse:
    return ext.ProcessingResponse(response_headers=ext.HeadersResponse())


def release_body(facts: Mapping[str, float | str],
                 set_headers: Iterable[tuple[str, str]] = (),
                 attempt_order: AttemptOrder | None = None) -> ext.ProcessingResponse:
    """A held reply goes on, its body unchanged; what the sidecar read of it goes to the
    usage metadata, where the access log finds it as it finds json_to_metadata's; its
    headers (still held) get `set_headers`."""
    response = ext.ProcessingResponse(response_body=ext.BodyResponse())
    if set_headers:
        _add_sets(response.response_body.response.header_mutation.set_headers, set_headers)
    if facts:
        response.dynamic_metadata.update({USAGE_NAMESPACE: dict(facts)})
    if attempt_order is not None:
        # A refusal, a 5xx or a 429: the order of the router's next attempts.
        response.dynamic_metadata.update({ROUTE_NAMESPACE: _priority_groups(attempt_order)})
    return response


def retry_held_reply(status: int, attempt_order: AttemptOrder | None = None
                     ) -> ext.ProcessingResponse:
    """The held reply's headers, with a status the router retries (the reply itself is an
    in-band failure behind a 200), and the order of its next attempts when it changed."""
    response = ext.ProcessingResponse()
    _add_sets(response.response_headers.response.header_mutation.set_headers,
              ((":status", str(status)),))
    if attempt_order is not None:
        response.dynamic_metadata.update({ROUTE_NAMESPACE: _priority_groups(attempt_order)})
    return response


def continue_attempt() -> ext.ProcessingResponse:
    return ext.ProcessingResponse(request_headers=ext.HeadersResponse())


def retarget(outcome: Retarget) -> ext.ProcessingResponse | BodyAnswer:
    """Header mutations made here stay on the request for later attempts, so every
    per-target header is set or removed on every retry (ARCHITECTURE.md)."""
    return _body_response(outcome.set_headers, outcome.remove_headers, outcome.body_parts)


def bridge_request(rewrite: Rewrite) -> ext.ProcessingResponse | BodyAnswer:
    """A bridged attempt's request, translated for its target (docs/dialects.md §7)."""
    return _body_response(rewrite.set_headers, rewrite.remove_headers, [rewrite.body or b""])


def bridge_response_headers(rewrite: Rewrite) -> ext.ProcessingResponse:
    response = ext.ProcessingResponse()
    mutation = response.response_headers.response.header_mutation
    _add_sets(mutation.set_headers, rewrite.set_headers)
    mutation.remove_headers.extend(rewrite.remove_headers)
    return response


def bridge_empty_answer(headers: Rewrite, answer: Rewrite) -> ext.ProcessingResponse:
    """Headers that end the stream, and the body their translation gives (an error in the
    caller's dialect for an empty 2xx): CONTINUE_AND_REPLACE puts a body where none came.
    The answer's headers win over the header rewrite's."""
    response = ext.ProcessingResponse()
    common = response.response_headers.response
    common.status = ext.CommonResponse.CONTINUE_AND_REPLACE
    chosen = dict(headers.set_headers) | dict(answer.set_headers)
    _add_sets(common.header_mutation.set_headers, chosen.items())
    common.header_mutation.remove_headers.extend(
        name for name in (*headers.remove_headers, *answer.remove_headers) if name not in chosen)
    if answer.body is not None:
        common.body_mutation.body = answer.body
    return response


def bridge_response_body(rewrite: Rewrite) -> ext.ProcessingResponse:
    """The translated answer; header changes still apply (the body was buffered, so the
    headers have not left Envoy yet)."""
    response = ext.ProcessingResponse()
    common = response.response_body.response
    _add_sets(common.header_mutation.set_headers, rewrite.set_headers)
    common.header_mutation.remove_headers.extend(rewrite.remove_headers)
    if rewrite.body is not None:  # None: the answer passes unchanged
        common.body_mutation.body = rewrite.body
    return response
