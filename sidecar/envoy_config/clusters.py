"""The clusters of the bootstrap: one per target (and per bridged route of a target),
built from a few templates, and the one Envoy reaches the sidecar by.

A target cluster carries the upstream filters of its attempts: the bounded-reply hold, the
reply gates, the per-attempt hooks and the credential injector (fallback.py,
reply_gate.py, credentials.py); the sidecar's cluster speaks HTTP/2 and is health-checked
(readiness.py)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from datetime import timedelta
from urllib.parse import urlsplit

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    DataSource,
    Http1ProtocolOptions,
    Http2ProtocolOptions,
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
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
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
from envoy_data_plane.google.protobuf import Any

from sidecar.bridge.registry import processed_routes
from sidecar.config.models import Provider, SidecarConfig, Target
from sidecar.envoy_config.addresses import EnvoyAddresses, find_ca_bundle, split_host_port
from sidecar.envoy_config.bridges import bridge_filters
from sidecar.envoy_config.credentials import injector_filters
from sidecar.envoy_config.fallback import attempt_filters, target_circuit_breakers
from sidecar.envoy_config.readiness import sidecar_health_check
from sidecar.envoy_config.reply_gate import first_event_gate, undeclared_length_gate
from sidecar.envoy_config.upstream_errors import held_reply_limit, hold_bounded_replies
from sidecar.envoy_contract import (
    EXT_PROC_CLUSTER,
    SESSION_KEY_HEADER,
    bridge_cluster_name,
    target_cluster_name,
)
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.time_scale import time_scale
from sidecar.header_policy import cluster_stripped_headers, credential_headers

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
ENVOY_SIDECAR_IDLE_SHARE = 0.8


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
                return target_cluster(name, provider, addresses.ca_bundle, filters)

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
                    return target_cluster(
                        name, provider, addresses.ca_bundle,
                        bridge_filters(message_timeout_ms, cleared, stripped, held,
                                       injectors()))

                yield (bridge_cluster_name(group_name, index, target.provider,
                                           processed.suffix),
                       (target.provider, dialects, processed.suffix), through_sidecar)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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


# Envoy's write buffer on a connection to the sidecar may hold everything the sidecar's
# HTTP/2 windows let it send (the connection window; never more) plus HEADERS frames. With
# the default 1 MiB limit, several large prompts at once on one connection crossed the
# buffer's high watermark, and Envoy 1.40 then crashed (a segfault in its HTTP/2 client
# while streams of ext_proc were being reset or answered; docs/envoy-crash-report.md).
# Above the window the watermark is never crossed, and Envoy holds no more than the
# window already let it.
EXT_PROC_CONNECTION_BUFFER_BYTES = ServerLimits().connection_window + 4 * 1024 * 1024


def ext_proc_cluster(address: str) -> Cluster:
    host, port = split_host_port(address)
    options = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions()
        ),
        # Envoy closes an idle connection to the sidecar before the sidecar's own idle
        # timeout would (ServerLimits.idle_timeout), so a new ext_proc stream never races a
        # GOAWAY from the sidecar.
        # (The soak's test knob scales both: grpcwire/time_scale.py.)
        common_http_protocol_options=HttpProtocolOptionsCore(idle_timeout=timedelta(
            seconds=ServerLimits().idle_timeout * ENVOY_SIDECAR_IDLE_SHARE / time_scale())),
    )
    return Cluster(
        name=EXT_PROC_CLUSTER,
        type=_discovery(host),
        connect_timeout=timedelta(seconds=1),
        load_assignment=_endpoints(EXT_PROC_CLUSTER, host, port),
        typed_extension_protocol_options={HTTP_PROTOCOL_OPTIONS: Any.pack(options)},
        health_checks=[sidecar_health_check()],
        per_connection_buffer_limit_bytes=EXT_PROC_CONNECTION_BUFFER_BYTES,
    )


def target_cluster(name: str, provider: Provider, ca_bundle: str | None,
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
