"""Render the Envoy bootstrap for a routing configuration, from typed Envoy API objects.

The same function produces the file `sidecar up` and the tests run and the committed
`envoy/envoy-compose.yaml`; only the addresses differ. Built with envoy-data-plane's typed
classes (correctness first; thousands of targets are built from a few templates, see
`bootstrap_document`) and emitted in snake_case YAML.

Shape: one listener whose HTTP connection manager runs the router-level ext_proc filter
(request headers + buffered body, nothing on the response path) and then the router; one
route whose attempts follow the target order the sidecar put in dynamic metadata, with
retries to the next target before the response starts (fallback.py); one cluster per target
plus one for the sidecar.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Callable, Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import betterproto2
import yaml
from envoy_data_plane.envoy.config.bootstrap.v3 import (
    Admin,
    Bootstrap,
    BootstrapStaticResources,
    LayeredRuntime,
    RuntimeLayer,
)
from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutationRules
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http1ProtocolOptions,
    Http2ProtocolOptions,
    Node,
    SocketAddress,
    TransportSocket,
)
from envoy_data_plane.envoy.config.core.v3 import (
    HttpProtocolOptions as HttpProtocolOptionsCore,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
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
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    SubjectAltNameMatcher,
    SubjectAltNameMatcherSanType,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Any, Struct

from sidecar.bridge.registry import processed_routes
from sidecar.config.models import (
    Provider,
    SidecarConfig,
    Target,
)
from sidecar.envoy_config.addresses import EnvoyAddresses, find_ca_bundle, split_host_port
from sidecar.envoy_config.bridges import bridge_filters
from sidecar.envoy_config.channel import CHANNEL_TOKEN_PLACEHOLDER, add_channel_token
from sidecar.envoy_config.credentials import injector_filters
from sidecar.envoy_config.fallback import (
    add_attempt_order,
    attempt_filters,
    no_target_cluster,
    request_only_mode,
    target_circuit_breakers,
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
from sidecar.envoy_config.readiness import readiness_filter, sidecar_health_check
from sidecar.envoy_config.reply_gate import first_event_gate, undeclared_length_gate
from sidecar.envoy_config.response_headers import (
    RE2_PROGRAM_SIZE,
    RE2_PROGRAM_SIZE_KEY,
    response_header_filter,
)
from sidecar.envoy_config.routes import model_group_routes
from sidecar.envoy_config.unasked_usage import unasked_usage_filter
from sidecar.envoy_config.upstream_errors import (
    RESET_CLOSE_DELAY,
    final_upstream_errors,
    held_reply_limit,
    hold_bounded_replies,
    kept_response_headers,
)
from sidecar.envoy_contract import (
    ATTEMPT_LOG_NAME,
    EXT_PROC_CLUSTER,
    ROUTE_CLASS_HEADER,
    ROUTE_NAMESPACE,
    SESSION_KEY_HEADER,
    USAGE_UNASKED_HEADER,
    bridge_cluster_name,
    target_cluster_name,
)
from sidecar.grpcwire.limits import ServerLimits
from sidecar.header_policy import cluster_stripped_headers, credential_headers

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# libyaml's emitter where PyYAML has it: 20× faster on a bootstrap of thousands of clusters.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
ENVOY_SIDECAR_IDLE_SECONDS = ServerLimits().idle_timeout * 0.8
CLIENT_ADDRESS_HEADERS = ("x-forwarded-for", "x-envoy-external-address", "x-envoy-internal")


def render_envoy_yaml(config: SidecarConfig, addresses: EnvoyAddresses,
                      channel_token: str | None = None) -> str:
    """The bootstrap as YAML. `channel_token` is the secret Envoy presents on every call to
    the sidecar (grpcwire/auth.py); None renders a placeholder that a deployment replaces
    (the committed compose file)."""
    return bootstrap_yaml(rendered_document(config, addresses, channel_token))


def rendered_document(config: SidecarConfig, addresses: EnvoyAddresses,
                      channel_token: str | None = None) -> dict:
    """The whole static bootstrap as plain data, the channel token in place."""
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
    clusters = [_ext_proc_cluster(addresses.ext_proc), no_target_cluster()]
    if with_targets:
        clusters += [build(name) for name, _, build in target_clusters(config, addresses)]
    listeners = [_listener(config, addresses.listen)]
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


ClusterBuilder = Callable[[str], Cluster]


def target_clusters(config: SidecarConfig, addresses: EnvoyAddresses
                    ) -> Iterator[tuple[str, tuple[object, ...], ClusterBuilder]]:
    """Every target cluster: (name, template key, builder). Two clusters with the same key
    differ only in their names."""
    message_timeout_ms = config.limits.sidecar_message_timeout_ms
    cleared = credential_headers(config)
    # A bounded reply is held until complete, so one that breaks is retried.
    held = hold_bounded_replies(held_reply_limit(config.limits.max_request_body_bytes))
    undeclared = undeclared_length_gate(message_timeout_ms, cleared)
    for group_name, group in config.models.items():
        # Streams of this group wait for their first event before the caller is answered.
        first_event = (group.fallback.first_event_wait_seconds
                       if group.fallback.commit_at_first_event else None)
        for index, target in enumerate(group.targets):
            provider = config.providers[target.provider]
            dialects = tuple(config.target_dialects(target))
            stripped = cluster_stripped_headers(config, target.provider)

            def injectors(target: Target = target) -> list[HttpFilter]:
                return injector_filters(config, target, addresses.secrets_dir)

            def native(name: str, provider: Provider = provider, stripped: tuple = stripped,
                       held: HttpFilter = held, injectors: Callable = injectors,
                       first_event: float | None = first_event) -> Cluster:
                gates = [undeclared]
                if first_event is not None:
                    gates.append(first_event_gate(first_event, cleared))
                filters = [held, *gates, *attempt_filters(message_timeout_ms, cleared,
                                                          stripped, injectors())]
                return _target_cluster(name, provider, addresses.ca_bundle, filters)

            yield (target_cluster_name(group_name, index, target.provider),
                   (target.provider, dialects, "native", first_event), native)
            for processed in processed_routes(dialects, group.bridges,
                                              group.caches_responses):
                # A session never retries: its key may be stripped before the provider.
                also = (SESSION_KEY_HEADER,) if processed.kind == "session" else ()

                def through_sidecar(name: str, provider: Provider = provider,
                                    stripped: tuple = (*stripped, *also),
                                    held: HttpFilter = held,
                                    injectors: Callable = injectors) -> Cluster:
                    return _target_cluster(
                        name, provider, addresses.ca_bundle,
                        bridge_filters(message_timeout_ms, cleared, stripped, held,
                                       injectors()))

                yield (bridge_cluster_name(group_name, index, target.provider,
                                           processed.suffix),
                       (target.provider, dialects, processed.suffix), through_sidecar)


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


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
                                       USAGE_UNASKED_HEADER],
        ),
        http_filters=[
            # GET /ready for load balancers, answered by Envoy (envoy_config/readiness.py).
            readiness_filter(),
            HttpFilter(name="envoy.filters.http.ext_proc", typed_config=Any.pack(ext_proc)),
            # After the usage readers on the response path: they read what it removes.
            *([unasked_usage_filter()] if observe.enabled else []),
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


def _endpoints(name: str, host: str, port: int) -> ClusterLoadAssignment:
    endpoint = Endpoint(
        address=Address(socket_address=SocketAddress(address=host, port_value=port)),
        hostname=host,
    )
    return ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[LocalityLbEndpoints(lb_endpoints=[LbEndpoint(endpoint=endpoint)])],
    )


def _discovery(host: str) -> ClusterDiscoveryType:
    return ClusterDiscoveryType.STATIC if _is_ip(host) else ClusterDiscoveryType.STRICT_DNS


def _ext_proc_cluster(address: str) -> Cluster:
    host, port = split_host_port(address)
    options = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions()
        ),
        # Envoy closes an idle connection to the sidecar before the sidecar's own idle
        # timeout would (ServerLimits.idle_timeout), so a new ext_proc stream never races a
        # GOAWAY from the sidecar.
        common_http_protocol_options=HttpProtocolOptionsCore(
            idle_timeout=timedelta(seconds=ENVOY_SIDECAR_IDLE_SECONDS)),
    )
    return Cluster(
        name=EXT_PROC_CLUSTER,
        type=_discovery(host),
        connect_timeout=timedelta(seconds=1),
        load_assignment=_endpoints(EXT_PROC_CLUSTER, host, port),
        typed_extension_protocol_options={HTTP_PROTOCOL_OPTIONS: Any.pack(options)},
        health_checks=[sidecar_health_check()],
    )


def _target_cluster(name: str, provider: Provider, ca_bundle: str | None,
                    filters: list[HttpFilter]) -> Cluster:
    parts = urlsplit(provider.base_url)
    host = parts.hostname or ""
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    protocol = (HttpProtocolOptionsExplicitHttpConfig(
        http2_protocol_options=Http2ProtocolOptions()) if provider.protocol == "http2"
        else HttpProtocolOptionsExplicitHttpConfig(http_protocol_options=Http1ProtocolOptions()))
    options = HttpProtocolOptions(explicit_http_config=protocol, http_filters=filters)
    cluster = Cluster(
        name=name,
        type=_discovery(host),
        connect_timeout=timedelta(seconds=provider.connect_timeout_seconds),
        load_assignment=_endpoints(name, host, port),
        typed_extension_protocol_options={HTTP_PROTOCOL_OPTIONS: Any.pack(options)},
        circuit_breakers=target_circuit_breakers(),
    )
    if tls:
        # Verify the chain (system trust store unless a CA file is given) *and* that the
        # certificate names this host: without a SAN matcher Envoy accepts any trusted cert.
        validation = CertificateValidationContext(
            match_typed_subject_alt_names=[SubjectAltNameMatcher(
                san_type=SubjectAltNameMatcherSanType.DNS, matcher=StringMatcher(exact=host))],
        )
        validation.trusted_ca = DataSource(filename=ca_bundle or find_ca_bundle())
        context = UpstreamTlsContext(sni=host, common_tls_context=CommonTlsContext(
            validation_context=validation,
            # HTTP/2 over TLS is asked for in the handshake (a server without h2 refuses).
            alpn_protocols=["h2"] if provider.protocol == "http2" else []))
        cluster.transport_socket = TransportSocket(
            name="envoy.transport_sockets.tls", typed_config=Any.pack(context)
        )
    return cluster
