"""The reply gate: upstream filters that hold a reply before Envoy's router sees it, so a
reply that fails before the caller has a byte can still go to the next target
(docs/reply-gate.md).

Envoy's router commits to an attempt when it sees the response headers. The Lua hold
(upstream_errors.py) keeps a reply of declared, bounded length from it until complete; these
two filters cover what Lua cannot, with the sidecar as an upstream ext_proc that answers
only what it must:

- **Replies of undeclared length** (chunked, or HTTP/2 without a length) that are not event
  streams: response headers and the body up to Envoy's buffer limit go to the sidecar
  (`BUFFERED_PARTIAL`). The sidecar reads their usage (Envoy's `json_to_metadata` cannot:
  it would hold them unbounded) and returns it as `sidecar.usage` dynamic metadata, which
  the access log carries as it does `json_to_metadata`'s. A reply that breaks before its
  end is an upstream reset for the router, which retries it. A reply longer than the
  buffer limit passes on unread after it.
- **Event streams, in groups with `fallback.commit_at_first_event`**: the headers and the
  first chunks go to the sidecar (`STREAMED`, sent without waiting for its answer to the
  headers); it answers nothing until the first complete event has arrived. Then it either
  ends its gRPC stream, which Envoy takes as "processing complete" and lets the held bytes
  and the rest of the stream flow natively, or, when that event is an error, rewrites
  `:status` so the router retries the attempt on the next target. No event by the first-
  token deadline: the router's per-try timeout (the sidecar sets it to the deadline for
  these streams) fires while the headers are still held, and the attempt is retried; a
  first attempt with a deadline of its own (gateway/first_event_deadline.py) is answered
  as a 504 by the sidecar at that deadline, and retried the same way.

Both are skipped by matchers on the response headers, so a reply of declared length (the
common case) and, without the opt-in, every stream never open a gRPC stream. Both fail
open (`failure_mode_allow`): a sidecar that is down or slow lets the reply pass unread,
as it would have without the gate.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.core.v3 import GrpcService, GrpcServiceEnvoyGrpc
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    HeaderForwardingRules,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import ListStringMatcher
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher as EnvoyStringMatcher
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.type.matcher.v3 import (
    MatcherMatcherListPredicate,
    MatcherMatcherListPredicatePredicateList,
    RegexMatcher,
    RegexMatcherGoogleRe2,
    StringMatcher,
)

from sidecar.envoy_config.matchers import Predicate, negated, response_header, skipped_when
from sidecar.envoy_contract import EXT_PROC_CLUSTER, ROUTE_NAMESPACE, USAGE_NAMESPACE

# ext_proc's message timeout may not exceed an hour.
MAX_MESSAGE_TIMEOUT_S = 3600.0

_ANY = StringMatcher(safe_regex=RegexMatcher(google_re2=RegexMatcherGoogleRe2(), regex=".*"))
_EVENT_STREAM = StringMatcher(safe_regex=RegexMatcher(
    google_re2=RegexMatcherGoogleRe2(), regex="(?i)text/event-stream.*"))


def _either(*predicates: Predicate) -> Predicate:
    return MatcherMatcherListPredicate(
        or_matcher=MatcherMatcherListPredicatePredicateList(predicate=list(predicates)))


def _gate(body_mode: ProcessingModeBodySendMode, timeout_s: float,
          credential_headers: tuple[str, ...], early_body: bool,
          reads_order: bool = False) -> Any:
    """`reads_order`: the gate is sent the request's attempt order (`sidecar.route`) and
    may rewrite it, so that a refusal goes to the next other target
    (gateway/reply_gate.py, `order_after_refusal`)."""
    namespaces = [USAGE_NAMESPACE, ROUTE_NAMESPACE] if reads_order else [USAGE_NAMESPACE]
    processor = ExternalProcessor(
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER)),
        processing_mode=ProcessingMode(
            request_header_mode=ProcessingModeHeaderSendMode.SKIP,
            response_header_mode=ProcessingModeHeaderSendMode.SEND,
            request_body_mode=ProcessingModeBodySendMode.NONE,
            response_body_mode=body_mode,
            request_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
            response_trailer_mode=ProcessingModeHeaderSendMode.SKIP),
        message_timeout=timedelta(seconds=min(timeout_s, MAX_MESSAGE_TIMEOUT_S)),
        failure_mode_allow=True,
        send_body_without_waiting_for_header_response=early_body,
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(
                untyped=[ROUTE_NAMESPACE] if reads_order else []),
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=namespaces)),
        # Only response headers are sent, but never a credential if Envoy ever sent more.
        forward_rules=HeaderForwardingRules(disallowed_headers=ListStringMatcher(
            patterns=[EnvoyStringMatcher(exact=name) for name in credential_headers])),
    )
    return Any.pack(processor)


def undeclared_length_gate(message_timeout_ms: int,
                           credential_headers: tuple[str, ...]) -> HttpFilter:
    """Holds replies without a content-length that are not event streams."""
    declared = _either(response_header("content-length", _ANY),
                       response_header("content-type", _EVENT_STREAM))
    return skipped_when(declared, "sidecar.gate_undeclared_length", "envoy.filters.http.ext_proc",
                        _gate(ProcessingModeBodySendMode.BUFFERED_PARTIAL,
                              message_timeout_ms / 1000, credential_headers, early_body=False,
                              reads_order=True))


def first_event_gate(first_event_wait_s: float,
                     credential_headers: tuple[str, ...]) -> HttpFilter:
    """Holds an event stream until its first complete event (opt-in per group). The
    sidecar answers the headers only then, so its message timeout must outlast the wait the
    router's per-try timeout bounds."""
    not_a_stream = negated(response_header("content-type", _EVENT_STREAM))
    return skipped_when(not_a_stream, "sidecar.gate_first_event", "envoy.filters.http.ext_proc",
                        _gate(ProcessingModeBodySendMode.STREAMED, first_event_wait_s + 1.0,
                              credential_headers, early_body=True, reads_order=True))
