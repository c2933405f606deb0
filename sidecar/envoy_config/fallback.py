"""Envoy pieces for pre-commit fallback across a decision's targets.

- The route picks its cluster with the priority-group cluster specifier, which reads the
  decision's order from dynamic metadata (`sidecar.route`): attempt n goes to the n-th
  cluster. The retry policy moves a failed attempt (connect failure, reset, 429, 5xx,
  per-try timeout) to the next one; Envoy never retries once the response has started.
- Each target cluster runs a per-attempt ext_proc hook that rewrites a retry's copy of the
  request for its own target (path, model); the target's key is injected by Envoy
  itself (credentials.py). A matcher skips it on first attempts, so
  the happy path pays nothing: the router-level exchange already rewrote for the primary.
- A header-mutation filter drops the x-envoy-* headers Envoy adds per attempt, so providers
  see none of Envoy's internals.

envoy-data-plane 2.2 has no class for the priority-group specifier (Envoy 1.40 has the
extension), so it is added to the rendered document as plain data.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    Cluster,
    ClusterDiscoveryType,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import (
    HeaderMutation as HeaderMutationRule,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutationRules
from envoy_data_plane.envoy.config.core.v3 import (
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
)
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment
from envoy_data_plane.envoy.config.route.v3 import (
    HeaderMatcher,
    RetryPolicy,
    RetryPolicyRateLimitedRetryBackOff,
    RetryPolicyResetHeader,
    RetryPolicyResetHeaderFormat,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    HeaderForwardingRules,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.header_mutation.v3 import (
    HeaderMutation,
    Mutations,
)
from envoy_data_plane.envoy.extensions.filters.http.upstream_codec.v3 import UpstreamCodec
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import ListStringMatcher
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher as EnvoyStringMatcher
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.type.matcher.v3 import (
    StringMatcher,
)

from sidecar.config.models import SidecarConfig
from sidecar.envoy_config.matchers import (
    request_header,
    skipped_when,
)
from sidecar.envoy_contract import (
    ATTEMPT_MARK_HEADER,
    CACHE_HEADER,
    CLUSTER_ATTRIBUTE,
    CONTEXT_RETRY_HEADER,
    EXT_PROC_CLUSTER,
    NO_TARGET_CLUSTER,
    ROUTE_NAMESPACE,
    SAME_TARGET_WAIT_HEADER,
    SHADOW_LISTENER,
)

# What moves an attempt to the next target. `5xx` covers resets, connect failures and
# per-try timeouts too; 429 (rate limited) is added, and 401/403: the caller was already
# authenticated by the sidecar, so a provider refusing the request's credentials refuses
# the gateway's key for that target. Other 4xx are the request's own fault and go back.
RETRY_ON = "5xx,reset,connect-failure,retriable-status-codes,retriable-headers"
RETRIABLE_STATUS_CODES = (401, 403, 429)
ATTEMPT_HEADER = "x-envoy-attempt-count"
# Envoy's per-attempt headers; providers get none of them.
ENVOY_ATTEMPT_HEADERS = (ATTEMPT_HEADER, "x-envoy-expected-rq-timeout-ms",
                         "x-envoy-original-host")
PRIORITY_GROUP = "envoy.router.cluster_specifier_plugin.priority_group"
PRIORITY_GROUP_TYPE = ("type.googleapis.com/envoy.extensions.router.cluster_specifiers."
                       "priority_group.v3.PriorityGroupClusterSpecifier")


# Envoy's per-cluster defaults allow 3 retries in flight and 1,024 requests. A retry holds
# its slot until the fallback answers (a whole unary generation), and LLM streams are long,
# so the defaults would silently turn fallback off under load and cap concurrent streams.
# Providers enforce their own limits; these only keep Envoy from refusing work itself.
MAX_IN_FLIGHT = 100_000


def target_circuit_breakers() -> CircuitBreakers:
    return CircuitBreakers(thresholds=[CircuitBreakersThresholds(
        max_connections=MAX_IN_FLIGHT, max_pending_requests=MAX_IN_FLIGHT,
        max_requests=MAX_IN_FLIGHT, max_retries=MAX_IN_FLIGHT)])


# A lone target's second attempt: only after a failure of the provider's own.
LONE_RETRY_ON = "5xx,reset,connect-failure"


def lone_retry_policy(config: SidecarConfig) -> RetryPolicy:
    """The route of decisions of one target (Fallback.retries_lone_target): one more
    attempt at it, after Envoy's short back-off, on a 5xx (a 503 or 529 that names a wait
    included: its `retry-after` still keeps the target out of later decisions), a reset,
    no connection or a per-try timeout (Envoy counts a read timeout as a reset); a 429, a
    refused key or a context-length 400 goes back to the caller (the same target would
    answer the same)."""
    return RetryPolicy(retry_on=LONE_RETRY_ON, num_retries=1)


def retry_policy(config: SidecarConfig, rate_limit_wait_s: float = 0.0) -> RetryPolicy:
    """Every request sets its own number of retries (`x-envoy-max-retries`: the decision's
    fallbacks within the group's `max_attempts`), which replaces `num_retries`; the value
    here only applies to a request that somehow has none. `rate_limit_wait_s`: where the
    hold or the reply gate put the same target next after a reply whose `retry-after` is
    at most this, they copy it to SAME_TARGET_WAIT_HEADER and Envoy waits that long
    instead of its short back-off; a retry on another target never waits (issue 40: with
    `retry-after` itself as the reset header, a target's second 429 also delayed the
    next target)."""
    most = max(group.fallback.max_attempts for group in config.models.values())
    waits = RetryPolicyRateLimitedRetryBackOff(
        reset_headers=[RetryPolicyResetHeader(name=SAME_TARGET_WAIT_HEADER,
                                              format=RetryPolicyResetHeaderFormat.SECONDS)],
        max_interval=timedelta(seconds=rate_limit_wait_s)) if rate_limit_wait_s else None
    return RetryPolicy(
        rate_limited_retry_back_off=waits,
        retry_on=RETRY_ON,
        num_retries=most - 1,
        retriable_status_codes=list(RETRIABLE_STATUS_CODES),
        # A held reply another target may serve (a context-length 400: upstream_errors.py).
        retriable_headers=[HeaderMatcher(name=CONTEXT_RETRY_HEADER, present_match=True)],
        refresh_cluster_on_retry=True,
    )


def attempt_order_specifier() -> dict:
    """The route's cluster specifier, as plain data (see the module docstring). Without an
    order in the metadata the request goes to a cluster with no endpoints: a JSON 503."""
    return {"extension": {"name": PRIORITY_GROUP, "typed_config": {
        "@type": PRIORITY_GROUP_TYPE,
        "priority_groups": [{"name": "no_decision",
                             "clusters": [{"cluster_name": NO_TARGET_CLUSTER, "weight": 1}]}],
        "override_metadata_namespace": ROUTE_NAMESPACE,
    }}}


def add_attempt_order(document: dict) -> dict:
    """Put the specifier on every route of the client listener of the rendered bootstrap
    (a dict); the internal listeners of hedging (hedging.py) each lead to one cluster, and
    the shadow listener (shadow_listener.py) to the cluster its request names."""
    for listener in document["static_resources"]["listeners"]:
        if "internal_listener" in listener or listener["name"] == SHADOW_LISTENER:
            continue
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                for host in manager["route_config"]["virtual_hosts"]:
                    for route in host["routes"]:
                        route["route"]["inline_cluster_specifier_plugin"] = (
                            attempt_order_specifier())
    return document


def no_target_cluster() -> Cluster:
    return Cluster(name=NO_TARGET_CLUSTER, type=ClusterDiscoveryType.STATIC,
                   connect_timeout=timedelta(seconds=1),
                   load_assignment=ClusterLoadAssignment(cluster_name=NO_TARGET_CLUSTER))


def request_only_mode(with_response: bool = False) -> ProcessingMode:
    """What the ext_proc filters ask for: request headers and the buffered body, nothing of
    the response (the sidecar must never sit in a native stream's path) — except on bridge
    clusters (`with_response`: the response's headers and buffered body too)."""
    return ProcessingMode(
        request_header_mode=ProcessingModeHeaderSendMode.SEND,
        response_header_mode=(ProcessingModeHeaderSendMode.SEND if with_response
                              else ProcessingModeHeaderSendMode.SKIP),
        request_body_mode=ProcessingModeBodySendMode.BUFFERED,
        response_body_mode=(ProcessingModeBodySendMode.BUFFERED if with_response
                            else ProcessingModeBodySendMode.NONE),
        request_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
        response_trailer_mode=ProcessingModeHeaderSendMode.SKIP,
    )


def attempt_processor(message_timeout_ms: int, credential_headers: tuple[str, ...],
                      mode: ProcessingMode | None = None) -> ExternalProcessor:
    """The sidecar as an upstream filter of a target cluster: it sees one attempt (by its
    cluster name), never the attempt's credentials, and a failure fails the attempt."""
    return ExternalProcessor(
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER)),
        processing_mode=mode or request_only_mode(),
        request_attributes=[CLUSTER_ATTRIBUTE],
        # The hook runs before this attempt's credentials are cleared, and header changes
        # carry over between attempts: without this, the previous attempt's injected key
        # would travel to the sidecar on every retry. The sidecar never needs a credential.
        forward_rules=HeaderForwardingRules(disallowed_headers=ListStringMatcher(
            patterns=[EnvoyStringMatcher(exact=name) for name in credential_headers])),
        message_timeout=timedelta(milliseconds=message_timeout_ms),
        # Never send a retry on with the previous target's key and model.
        failure_mode_allow=False,
        mutation_rules=HeaderMutationRules(allow_all_routing=True),
    )


def strip_filter(credential_headers: tuple[str, ...],
                 cleared_headers: tuple[str, ...]) -> HttpFilter:
    """Envoy's per-attempt headers and every credential header go before the provider:
    header changes carry over between attempts, so no attempt may inherit another target's
    key. (The caller-API marker stays: removed here, the next attempt would not see it.)"""
    strip = HeaderMutation(mutations=Mutations(
        request_mutations=[
            HeaderMutationRule(remove=name)
            for name in (*ENVOY_ATTEMPT_HEADERS, *credential_headers, *cleared_headers)],
        # Only the gateway says whether an answer came from its cache. The attempt's
        # number goes onto the reply for the hold's Lua (attempt_order_lua.py).
        response_mutations=[HeaderMutationRule(remove=CACHE_HEADER), HeaderMutationRule(
            append=HeaderValueOption(header=HeaderValue(
                key=ATTEMPT_MARK_HEADER, value="%UPSTREAM_REQUEST_ATTEMPT_COUNT%"),
                append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD))]))
    return HttpFilter(name="envoy.filters.http.header_mutation", typed_config=Any.pack(strip))


def attempt_filters(message_timeout_ms: int, credential_headers: tuple[str, ...],
                    cleared_headers: tuple[str, ...],
                    injectors: list[HttpFilter]) -> list[HttpFilter]:
    """Upstream HTTP filters of a target cluster: retarget a retry, strip Envoy's headers
    and every credential header (changes carry over between attempts), inject this
    target's key (credentials.py), then the codec (which must come last)."""
    first_attempt = request_header(ATTEMPT_HEADER, StringMatcher(exact="1"))
    return [
        skipped_when(first_attempt, "sidecar.retarget_retry", "envoy.filters.http.ext_proc",
                     Any.pack(attempt_processor(message_timeout_ms, credential_headers))),
        strip_filter(credential_headers, cleared_headers),
        *injectors,
        HttpFilter(name="envoy.filters.http.upstream_codec",
                   typed_config=Any.pack(UpstreamCodec())),
    ]
