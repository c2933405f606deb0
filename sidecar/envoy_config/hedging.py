"""Envoy pieces for hedged first tokens (docs/hedging.md).

Envoy 1.40 hedges on a per-try timeout (`hedge_on_per_try_timeout`): the first attempt
keeps running, a second starts, the first response headers win and the other attempt is
cancelled. With a hedge policy in force every retry stays on the first attempt's cluster
(`refresh_cluster_on_retry` is off), so a hedge can reach another target only inside one
cluster. Hence, per hedging group and ordered pair of its targets (A, B), a *pair cluster*:
A's internal listener at priority 0, B's at priority 1, and the hedging route's
`previous_priorities` retry priority sends the second attempt to priority 1. Each internal
listener leads to its target's own cluster, so its key, TLS, hold filter and reply gate
stay per target. The pair cluster's only upstream filters retarget a second attempt's
copy of the request for B (path, model, as for any retry) and drop the router's control
headers, which the internal listener's router would otherwise obey.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    EnvoyInternalAddress,
    Http1ProtocolOptions,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.config.listener.v3 import (
    Filter,
    FilterChain,
    Listener,
    ListenerInternalListenerConfig,
)
from envoy_data_plane.envoy.config.route.v3 import (
    HedgePolicy,
    RetryPolicyRetryPriority,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.bootstrap.internal_listener.v3 import InternalListener
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerServerHeaderTransformation,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.retry.priority.previous_priorities.v3 import (
    PreviousPrioritiesConfig,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any

from sidecar.config.models import SidecarConfig
from sidecar.envoy_config.fallback import attempt_filters, target_circuit_breakers
from sidecar.envoy_contract import (
    hedge_listener_name,
    hedge_pairs,
    target_cluster_name,
)

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# The router obeys these on a request from a trusted peer; an internal listener's router
# would take the outer request's per-try timeout (the hedge deadline) as its own and end
# the first attempt at it. The pair cluster removes them before the internal listener.
ROUTER_CONTROL_HEADERS = (
    "x-envoy-upstream-rq-per-try-timeout-ms", "x-envoy-upstream-rq-timeout-ms",
    "x-envoy-max-retries", "x-envoy-hedge-on-per-try-timeout", "x-envoy-retry-on",
    "x-envoy-retry-grpc-on", "x-envoy-retriable-status-codes",
    "x-envoy-retriable-header-names", "x-envoy-upstream-stream-duration-ms")


def hedging_targets(config: SidecarConfig) -> list[tuple[str, int, int, str]]:
    """(group, first, second, pair cluster) for every ordered pair of a hedging group's
    targets."""
    return [(name, first, second, pair) for name, group in config.models.items()
            if group.hedge is not None
            for first, second, pair in hedge_pairs(name, [t.provider for t in group.targets])]


def target_clusters_of_hedging_groups(config: SidecarConfig) -> list[str]:
    return [target_cluster_name(name, index, target.provider)
            for name, group in config.models.items() if group.hedge is not None
            for index, target in enumerate(group.targets)]


def internal_listener_extension() -> TypedExtensionConfig:
    return TypedExtensionConfig(name="envoy.bootstrap.internal_listener",
                                typed_config=Any.pack(InternalListener()))


def hedge_listener(target_cluster: str) -> Listener:
    """The internal listener in front of one target cluster: a router and nothing else,
    no timeout or retry of its own (the outer route's govern), no header of Envoy's added
    to what the target answers."""
    router = Router(suppress_envoy_headers=True)
    manager = HttpConnectionManager(
        stat_prefix="hedge_in",
        server_header_transformation=HttpConnectionManagerServerHeaderTransformation.PASS_THROUGH,
        stream_idle_timeout=timedelta(0),
        request_timeout=timedelta(0),
        route_config=RouteConfiguration(name=target_cluster, virtual_hosts=[VirtualHost(
            name="target", domains=["*"],
            # The target cluster's retarget hook runs only on retries: this is a first try.
            include_request_attempt_count=True,
            routes=[Route(match=RouteMatch(prefix="/"), route=RouteAction(
                cluster=target_cluster, timeout=timedelta(0), auto_host_rewrite=True))])]),
        http_filters=[HttpFilter(name="envoy.filters.http.router",
                                 typed_config=Any.pack(router))])
    return Listener(
        name=hedge_listener_name(target_cluster),
        internal_listener=ListenerInternalListenerConfig(),
        filter_chains=[FilterChain(filters=[Filter(
            name="envoy.filters.network.http_connection_manager",
            typed_config=Any.pack(manager))])])


def _internal_endpoint(listener: str, priority: int) -> LocalityLbEndpoints:
    address = Address(envoy_internal_address=EnvoyInternalAddress(
        server_listener_name=listener))
    return LocalityLbEndpoints(priority=priority,
                               lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=address))])


def pair_cluster(config: SidecarConfig, group: str, first: int, second: int, name: str,
                 cleared: tuple[str, ...]) -> Cluster:
    """Target `first` at priority 0, `second` at priority 1, through their internal
    listeners. A second attempt is retargeted for `second` by the sidecar (it knows the
    pair from the cluster's name); credentials are the target clusters' business."""
    targets = config.models[group].targets
    listeners = [hedge_listener_name(target_cluster_name(group, index, targets[index].provider))
                 for index in (first, second)]
    filters = attempt_filters(config.limits.sidecar_message_timeout_ms, cleared,
                              ROUTER_CONTROL_HEADERS, [])
    options = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http_protocol_options=Http1ProtocolOptions()),
        http_filters=filters)
    return Cluster(
        name=name, type=ClusterDiscoveryType.STATIC,
        connect_timeout=timedelta(seconds=1),
        load_assignment=ClusterLoadAssignment(cluster_name=name, endpoints=[
            _internal_endpoint(listener, priority)
            for priority, listener in enumerate(listeners)]),
        typed_extension_protocol_options={HTTP_PROTOCOL_OPTIONS: Any.pack(options)},
        circuit_breakers=target_circuit_breakers())


def hedge_retry_priority() -> RetryPolicyRetryPriority:
    """A retry goes to the next priority of the pair cluster: its second target."""
    return RetryPolicyRetryPriority(
        name="envoy.retry_priorities.previous_priorities",
        typed_config=Any.pack(PreviousPrioritiesConfig(update_frequency=1)))


HEDGE_ON_PER_TRY_TIMEOUT = HedgePolicy(hedge_on_per_try_timeout=True)
