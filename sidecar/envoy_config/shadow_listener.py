"""Envoy's loopback listener for shadow traffic (docs/rollout.md §4, rollout-design.md §2).

The sidecar mirrors a sampled live request to a candidate target by sending it here, after
the live decision and off the request path. The listener routes it to the target cluster
the request names — the same cluster live attempts use, so Envoy injects the provider's key
as for any attempt and the sidecar never holds one — and does nothing else a caller's
request gets: no ext_proc (nothing admitted, charged or decided), no retries, no fallback.
Its usage readers and access log are the live listener's, under their own log name, so
what the candidate did reaches its observations through the same code as live traffic.

Only the sidecar may use it: a request must carry the channel token (added to the rendered
document with the others, envoy_config/channel.py; without a real token the listener is
not rendered at all) and name a candidate's target cluster exactly; anything else is
answered 403 by Envoy itself, marked so the sidecar does not blame the candidate. It
listens where `--shadow-listen` says (loopback by default; the token is its protection
where Envoy and the sidecar are apart). The target cluster's own filters still run (its
key, its reply checks), but not its retry hook: every mirrored request is a first try.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.core.v3 import HeaderValue, HeaderValueOption
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Any

from sidecar.config.models import SidecarConfig
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.channel import CHANNEL_TOKEN_PLACEHOLDER
from sidecar.envoy_config.observation_filters import access_log, usage_filters
from sidecar.envoy_contract import (
    SHADOW_CLUSTER_HEADER,
    SHADOW_LISTENER,
    SHADOW_LOG_NAME,
    SHADOW_REFUSED_HEADER,
    SHADOW_TOKEN_HEADER,
    target_cluster_name,
)


def wants_shadow_listener(config: SidecarConfig, addresses: EnvoyAddresses) -> bool:
    return addresses.shadow is not None and any(
        group.rollout is not None and group.rollout.shadow_traffic is not None
        for group in config.models.values())


def candidate_clusters(config: SidecarConfig) -> list[str]:
    """The target clusters of the groups' shadow-traffic candidates (not their bridges: a
    mirror goes only to a candidate that speaks the caller's API)."""
    clusters = []
    for name, group in config.models.items():
        mirror = group.rollout.shadow_traffic if group.rollout is not None else None
        if mirror is None:
            continue
        for index, target in enumerate(group.targets):
            if f"{target.provider}/{target.model_ref}" == mirror.target:
                clusters.append(target_cluster_name(name, index, target.provider))
    return clusters


def shadow_listener(config: SidecarConfig, address) -> Listener:
    """`address`: the loopback Address to bind (render.py's _address). One route per
    candidate, matching its cluster's name exactly, then a 403 for everything else."""
    limits, observe = config.limits, config.observations
    routes = [Route(
        match=RouteMatch(prefix="/", headers=[
            HeaderMatcher(name=SHADOW_TOKEN_HEADER,
                          string_match=StringMatcher(exact=CHANNEL_TOKEN_PLACEHOLDER)),
            HeaderMatcher(name=SHADOW_CLUSTER_HEADER,
                          string_match=StringMatcher(exact=cluster))]),
        route=RouteAction(cluster=cluster, auto_host_rewrite=True,
                          timeout=timedelta(seconds=limits.request_timeout_seconds)),
        request_body_buffer_limit=limits.max_request_body_bytes)
        for cluster in candidate_clusters(config)]
    refused = Route(match=RouteMatch(prefix="/"),
                    direct_response=DirectResponseAction(status=403),
                    response_headers_to_add=[HeaderValueOption(header=HeaderValue(
                        key=SHADOW_REFUSED_HEADER, value="1"))])
    router = Router(suppress_envoy_headers=True)
    manager = HttpConnectionManager(
        stat_prefix="model_groups_shadow",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        route_config=RouteConfiguration(
            name=SHADOW_LISTENER,
            virtual_hosts=[VirtualHost(
                name=SHADOW_LISTENER, domains=["*"], routes=[*routes, refused],
                # Every mirrored request is a first try: the target cluster's retry hook
                # (fallback.py), which calls the sidecar, runs only on retries.
                include_request_attempt_count=True)],
            request_headers_to_remove=[SHADOW_TOKEN_HEADER, SHADOW_CLUSTER_HEADER]),
        http_filters=[
            *(usage_filters(limits.max_request_body_bytes) if observe.enabled else []),
            HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(router)),
        ],
        access_log=([access_log(observe.flush_interval_ms, SHADOW_LOG_NAME)]
                    if observe.enabled else []),
    )
    return Listener(name=SHADOW_LISTENER, address=address, filter_chains=[FilterChain(
        filters=[Filter(name="envoy.filters.network.http_connection_manager",
                        typed_config=Any.pack(manager))])])
