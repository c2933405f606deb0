"""The sidecar's gRPC port: ext_proc, the access-log receiver for observations, and the
standard gRPC health service."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.envoy_config.addresses import split_host_port
from sidecar.extproc.processor import METHOD, SERVICE, ExternalProcessor
from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire.auth import ChannelAuth
from sidecar.grpcwire.health import add_health
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.time_scale import scaled_limits, time_scale
from sidecar.observe.access_log import AccessLogReceiver

if TYPE_CHECKING:  # grpcio is imported only when it serves the port
    from sidecar.extproc.grpcio_server import GrpcioServer

GRPC_SERVERS = ("own", "grpcio")

# Headroom over the body itself for headers and protobuf framing.
_MESSAGE_OVERHEAD_BYTES = 1024 * 1024


async def start_server(processor: ExternalProcessor, address: str,
                       access_logs: AccessLogReceiver | None = None,
                       auth: ChannelAuth | None = None,
                       grpc_server: str = "own") -> GrpcServer | GrpcioServer:
    """Start serving on `address` (host:port); raise OSError if the port cannot be bound.

    The message limit follows `limits.max_request_body_bytes` (Envoy enforces that bound on
    the body before it reaches us), so large buffered bodies fit. `grpc_server` is "own"
    (sidecar/grpcwire) or "grpcio" (the escape hatch, extproc/grpcio_server.py). The
    timers run faster only under the soak's test knob (grpcwire/time_scale.py)."""
    limits = scaled_limits(ServerLimits.for_message_size(
        processor.max_body_bytes + _MESSAGE_OVERHEAD_BYTES), time_scale())
    if grpc_server == "grpcio":
        from sidecar.extproc.grpcio_server import GrpcioServer

        server: GrpcServer | GrpcioServer = GrpcioServer(limits, auth=auth)
        return await _serve(server, processor, address, access_logs)
    server = GrpcServer(limits, auth=auth)
    return await _serve(server, processor, address, access_logs)


async def _serve(server: GrpcServer | GrpcioServer, processor: ExternalProcessor, address: str,
                 access_logs: AccessLogReceiver | None) -> GrpcServer | GrpcioServer:
    server.add_method(SERVICE, METHOD, processor.stream)
    if access_logs is not None:
        server.add_method(AccessLogReceiver.SERVICE, AccessLogReceiver.METHOD,
                          access_logs.stream)
    server.health = add_health(server, [SERVICE])
    host, port = split_host_port(address)
    try:
        await server.start(host, port)
    except OSError as exc:
        raise OSError(f"cannot listen on {address} ({exc.strerror or exc})") from None
    return server
