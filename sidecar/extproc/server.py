"""The gRPC server: ext_proc, the access-log receiver for observations, and the standard gRPC
health service, all on one port."""

from __future__ import annotations

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from sidecar.extproc.processor import ExternalProcessor
from sidecar.observe.access_log import AccessLogReceiver

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Headroom over the body itself for headers and protobuf framing.
_MESSAGE_OVERHEAD_BYTES = 1024 * 1024


async def start_server(processor: ExternalProcessor, address: str,
                       access_logs: AccessLogReceiver | None = None) -> grpc.aio.Server:
    """Start serving on `address` (host:port); raise OSError if the port cannot be bound.

    gRPC's 4 MiB default message limit would reject large buffered bodies, so the limit
    follows `limits.max_request_body_bytes` (Envoy enforces that bound before we see it)."""
    max_message = processor.max_body_bytes + _MESSAGE_OVERHEAD_BYTES
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message),
            ("grpc.max_send_message_length", max_message),
            ("grpc.so_reuseport", 0),
        ]
    )
    ext_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    if access_logs is not None:
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(access_logs, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        server.add_insecure_port(address)
    except RuntimeError:
        raise OSError(f"cannot listen on {address} (port in use or address invalid)") from None
    await server.start()
    for service in ("", EXT_PROC_SERVICE):
        await health.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server
