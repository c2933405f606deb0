"""The standard gRPC health service (grpc.health.v1), for probes such as grpc_health_probe,
Kubernetes gRPC probes and Envoy's gRPC health checks."""

from __future__ import annotations

from collections.abc import Iterable

from grpc_health.v1 import health_pb2

from sidecar.grpcwire.call import NOT_FOUND, Call
from sidecar.grpcwire.server import GrpcServer

SERVICE = "grpc.health.v1.Health"
_SERVING = health_pb2.HealthCheckResponse(
    status=health_pb2.HealthCheckResponse.SERVING).SerializeToString()


class _Check:
    def __init__(self, services: frozenset[str], watch: bool) -> None:
        self._services = services
        self._watch = watch

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        service = health_pb2.HealthCheckRequest.FromString(payload).service
        if service in self._services:
            call.send(_SERVING)
            if not self._watch:
                call.finish()
        elif self._watch:  # Watch reports unknown services instead of failing
            call.send(health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN).SerializeToString())
        else:
            call.finish(NOT_FOUND, f"unknown service {service!r}")

    def on_half_close(self, call: Call) -> None:
        if not self._watch:
            call.finish()

    def on_cancel(self) -> None:
        pass


def add_health(server: GrpcServer, services: Iterable[str]) -> None:
    """Report SERVING for the server as a whole ("") and for each named service."""
    known = frozenset({"", *services})
    server.add_method(SERVICE, "Check", lambda: _Check(known, watch=False))
    server.add_method(SERVICE, "Watch", lambda: _Check(known, watch=True))
