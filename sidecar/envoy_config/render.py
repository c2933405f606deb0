"""Render the Envoy bootstrap for a routing configuration, from typed Envoy API objects.

The same function produces the file `sidecar up` and the tests run and the committed
`envoy/envoy-compose.yaml`; only the addresses differ. Built with envoy-data-plane's typed
classes (correctness first; thousands of targets are built from a few templates, see
`bootstrap_document`) and emitted in snake_case YAML.

Shape: one listener whose HTTP connection manager runs the router-level ext_proc filter
(request headers + buffered body, nothing on the response path) and then the router; one
route whose attempts follow the target order the sidecar put in dynamic metadata, with
retries to the next target before the response starts (fallback.py); one cluster per target
plus one for the sidecar (clusters.py).
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta

import betterproto2
import yaml
from envoy_data_plane.envoy.config.bootstrap.v3 import (
    Admin,
    Bootstrap,
    BootstrapStaticResources,
    LayeredRuntime,
    RuntimeLayer,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutationRules
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Node,
    SocketAddress,
)
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.overload.v3 import OverloadManager, ResourceMonitor
from envoy_data_plane.envoy.config.route.v3 import (
    RouteConfiguration,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.resource_monitors.downstream_connections.v3 import (
    DownstreamConnectionsConfig,
)
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Any, Struct

from sidecar.config.models import SidecarConfig
from sidecar.envoy_config.addresses import EnvoyAddresses, split_host_port
from sidecar.envoy_config.answer_facts import answer_facts_filter
from sidecar.envoy_config.channel import CHANNEL_TOKEN_PLACEHOLDER, add_channel_token
from sidecar.envoy_config.clusters import ext_proc_cluster, target_clusters
from sidecar.envoy_config.fallback import (
    add_attempt_order,
    no_target_cluster,
    request_only_mode,
)
from sidecar.envoy_config.hedging import (
    hedge_listener,
    hedging_targets,
    internal_listener_extension,
    pair_cluster,
    target_clusters_of_hedging_groups,
)
from sidecar.envoy_config.local_replies import client_http1_options, local_reply_config
from sidecar.envoy_config.observation_filters import access_log, usage_filters
from sidecar.envoy_config.readiness import readiness_filter
from sidecar.envoy_config.response_headers import (
    RE2_PROGRAM_SIZE,
    RE2_PROGRAM_SIZE_KEY,
    response_header_filter,
)
from sidecar.envoy_config.routes import model_group_routes
from sidecar.envoy_config.shadow_listener import shadow_listener, wants_shadow_listener
from sidecar.envoy_config.unasked_usage import unasked_usage_filter
from sidecar.envoy_config.upstream_errors import (
    RESET_CLOSE_DELAY,
    final_upstream_errors,
    kept_response_headers,
)
from sidecar.envoy_contract import (
    ANSWER_FACTS_HEADER,
    ATTEMPT_LOG_NAME,
    EXT_PROC_CLUSTER,
    ROUTE_CLASS_HEADER,
    ROUTE_NAMESPACE,
    USAGE_UNASKED_HEADER,
)
from sidecar.header_policy import credential_headers

# libyaml's emitter where PyYAML has it: 20× faster on a bootstrap of thousands of clusters.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
CLIENT_ADDRESS_HEADERS = ("x-forwarded-for", "x-envoy-external-address", "x-envoy-internal")


def render_envoy_yaml(config: SidecarConfig, addresses: EnvoyAddresses,
                      channel_token: str | None = None) -> str:
    """The bootstrap as YAML. `channel_token` is the secret Envoy presents on every call to
    the sidecar (grpcwire/auth.py); None renders a placeholder that a deployment replaces
    (the committed compose file)."""
    return bootstrap_yaml(rendered_document(config, addresses, channel_token))


def rendered_document(config: SidecarConfig, addresses: EnvoyAddresses,
                      channel_token: str | None = None) -> dict:
    """The whole static bootstrap as plain data, the channel token in place. Without a
    token (a placeholder a deployment replaces) there is no shadow listener: its route
    would answer anyone who knows the placeholder, and Envoy, not the sidecar, checks it."""
    if channel_token is None and addresses.shadow is not None:
        addresses = dataclasses.replace(addresses, shadow=None)
    return add_channel_token(bootstrap_document(config, addresses),
                             channel_token or CHANNEL_TOKEN_PLACEHOLDER)


def bootstrap_yaml(document: dict) -> str:
    header = (
        "# Generated by `sidecar render-envoy`; do not edit by hand.\n"
        "# Every change belongs in sidecar/envoy_config/render.py or the routing config.\n"
    )
    return header + yaml.dump(document, Dumper=_DUMPER, sort_keys=False,
                              default_flow_style=False)


def bootstrap_document(config: SidecarConfig, addresses: EnvoyAddresses) -> dict:
    """The bootstrap as plain data, including the parts envoy-data-plane has no class for.

    Target clusters are built once per template — provider, the APIs it is reached with,
    and the kind of route — and copied under each target's name: building and converting a
    typed cluster costs ~20 ms, and a configuration of real size has thousands of targets
    that differ only in their names (docs/performance.md)."""
    document = bootstrap(config, addresses).to_dict(casing=betterproto2.Casing.SNAKE)
    converted: dict[tuple[object, ...], dict] = {}
    clusters = document["static_resources"]["clusters"]
    for name, key, build in target_clusters(config, addresses):
        template = converted.get(key)
        if template is None:
            template = converted[key] = build(name).to_dict(casing=betterproto2.Casing.SNAKE)
        clusters.append(_renamed(template, name))
    return add_attempt_order(document)


def _renamed(template: dict, name: str) -> dict:
    cluster = copy.deepcopy(template)
    cluster["name"] = name
    cluster["load_assignment"]["cluster_name"] = name
    return cluster


def bootstrap(config: SidecarConfig, addresses: EnvoyAddresses,
              with_targets: bool = False) -> Bootstrap:
    """Typed part of the bootstrap: everything but the target clusters (unless
    `with_targets`), which `bootstrap_document` adds from templates, and the route's
    cluster specifier, which it adds too."""
    clusters = [ext_proc_cluster(addresses.ext_proc), no_target_cluster()]
    if with_targets:
        clusters += [build(name) for name, _, build in target_clusters(config, addresses)]
    listeners = [_listener(config, addresses.listen)]
    if wants_shadow_listener(config, addresses):  # docs/rollout.md §4
        listeners.append(shadow_listener(config, _address(addresses.shadow)))
    hedged = hedging_targets(config)
    if hedged:  # docs/hedging.md
        cleared = credential_headers(config)
        clusters += [pair_cluster(config, *pair, cleared) for pair in hedged]
        listeners += [hedge_listener(cluster)
                      for cluster in target_clusters_of_hedging_groups(config)]
    return Bootstrap(
        # Always there (it costs nothing idle): a reload that turns hedging on publishes
        # internal listeners, and the bootstrap is not published again (docs/hedging.md).
        bootstrap_extensions=[internal_listener_extension()],
        overload_manager=_overload_manager(config),
        # File-based SDS (the provider keys) needs the node to have a name.
        node=Node(id="model-group-sidecar", cluster="model-group-sidecar"),
        layered_runtime=_runtime(),
        admin=Admin(address=_address(addresses.admin)),
        static_resources=BootstrapStaticResources(
            listeners=listeners, clusters=clusters
        ),
    )


def _runtime() -> LayeredRuntime:
    """One static layer: the RE2 program size the response-header allowlist needs
    (response_headers.py). No admin layer: runtime values are not changed from outside."""
    static = Struct.from_dict({RE2_PROGRAM_SIZE_KEY: RE2_PROGRAM_SIZE})
    return LayeredRuntime(layers=[RuntimeLayer(name="sidecar", static_layer=static)])


def _overload_manager(config: SidecarConfig) -> OverloadManager:
    """Bound the client connections Envoy holds (it warns at start-up without a bound)."""
    monitor = DownstreamConnectionsConfig(
        max_active_downstream_connections=config.limits.max_client_connections)
    return OverloadManager(resource_monitors=[ResourceMonitor(
        name="envoy.resource_monitors.global_downstream_max_connections",
        typed_config=Any.pack(monitor))])


def _address(host_port: str) -> Address:
    host, port = split_host_port(host_port)
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def _listener(config: SidecarConfig, listen: str) -> Listener:
    limits = config.limits
    observe = config.observations
    ext_proc = ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER),
        ),
        processing_mode=request_only_mode(),
        message_timeout=timedelta(milliseconds=limits.sidecar_message_timeout_ms),
        failure_mode_allow=False,
        # The sidecar removes caller-sent x-envoy-* control headers and sets the retry
        # count and timeouts of each request's group.
        mutation_rules=HeaderMutationRules(allow_envoy=True),
        status_on_error=HttpStatus(code=StatusCode.ServiceUnavailable),
        metadata_options=MetadataOptions(
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=[ROUTE_NAMESPACE])),
    )
    routes = model_group_routes(config)
    # Attempts that did not answer cleanly are logged too, so failures before a fallback
    # reach the observations (observation_filters.failed_attempts_only).
    router = Router(upstream_log=[access_log(observe.flush_interval_ms, ATTEMPT_LOG_NAME)]
                    if observe.enabled else [],
                    # No x-envoy-* of the router's to providers (x-envoy-original-host
                    # named the gateway's own address) or callers.
                    suppress_envoy_headers=True)
    manager = HttpConnectionManager(
        stat_prefix="model_groups",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        # A response cut after it started (deadline, broken stream) reaches HTTP/1.1
        # callers as a closed connection: at once, not after Envoy's default 1 s.
        delayed_close_timeout=RESET_CLOSE_DELAY,
        local_reply_config=local_reply_config(),
        # Unknown/lowercase methods reach the sidecar (its 405 is in the caller's dialect).
        http_protocol_options=client_http1_options(),
        # Envoy is the edge: X-Forwarded-For gets the real client address.
        use_remote_address=True,
        route_config=RouteConfiguration(
            name="model_groups",
            virtual_hosts=[VirtualHost(
                name="model_groups", domains=["*"], routes=routes,
                # x-envoy-attempt-count tells the per-attempt hook a retry from a first try.
                include_request_attempt_count=True)],
            # The caller's address (Envoy adds it as the edge): providers learn nothing
            # about who called. (The sidecar drops it too, with every header not on the
            # allowlist; this keeps it out even of requests the sidecar never saw.)
            request_headers_to_remove=[*CLIENT_ADDRESS_HEADERS, ROUTE_CLASS_HEADER,
                                       USAGE_UNASKED_HEADER, ANSWER_FACTS_HEADER],
        ),
        http_filters=[
            # GET /ready for load balancers, answered by Envoy (envoy_config/readiness.py).
            readiness_filter(),
            HttpFilter(name="envoy.filters.http.ext_proc", typed_config=Any.pack(ext_proc)),
            # After the usage readers on the response path: they read what it removes.
            *([unasked_usage_filter(), answer_facts_filter()] if observe.enabled else []),
            # Responses pass it last: only allowlisted provider headers reach the caller.
            response_header_filter(config),
            final_upstream_errors(),
            kept_response_headers(),
            *(usage_filters(limits.max_request_body_bytes) if observe.enabled else []),
            HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(router)),
        ],
        access_log=[access_log(observe.flush_interval_ms)] if observe.enabled else [],
    )
    return Listener(
        name="model_groups",
        address=_address(listen),
        filter_chains=[
            FilterChain(
                filters=[
                    Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=Any.pack(manager),
                    )
                ]
            )
        ],
    )
