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
_NOT_SERVING = health_pb2.HealthCheckResponse(
    status=health_pb2.HealthCheckResponse.NOT_SERVING).SerializeToString()


class HealthState:
    """SERVING until a drain begins (operations/drain.py); Watch calls hear the change."""

    def __init__(self) -> None:
        self.serving = True
        self._watchers: set[Call] = set()

    @property
    def answer(self) -> bytes:
        return _SERVING if self.serving else _NOT_SERVING

    def stop_serving(self) -> None:
        self.serving = False
        for call in list(self._watchers):
            call.send(_NOT_SERVING)

    def watch(self, call: Call) -> None:
        self._watchers.add(call)

    def forget(self, call: Call) -> None:
        self._watchers.discard(call)


class _Check:
    def __init__(self, services: frozenset[str], watch: bool, state: HealthState) -> None:
        self._services = services
        self._watch = watch
        self._state = state
        self._call: Call | None = None

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        service = health_pb2.HealthCheckRequest.FromString(payload).service
        if service in self._services:
            call.send(self._state.answer)
            if not self._watch:
                call.finish()
            elif self._state.serving:  # a later drain is announced on this call
                self._call = call
                self._state.watch(call)
        elif self._watch:  # Watch reports unknown services instead of failing
            call.send(health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN).SerializeToString())
        else:
            call.finish(NOT_FOUND, f"unknown service {service!r}")

    def on_half_close(self, call: Call) -> None:
        if not self._watch:
            call.finish()

    def on_cancel(self) -> None:
        if self._call is not None:
            self._state.forget(self._call)


def add_health(server: GrpcServer, services: Iterable[str],
               state: HealthState | None = None) -> HealthState:
    """Report SERVING (or NOT_SERVING once `state` says so) for the server as a whole ("")
    and for each named service."""
    state = state or HealthState()
    known = frozenset({"", *services})
    server.add_method(SERVICE, "Check", lambda: _Check(known, False, state))
    server.add_method(SERVICE, "Watch", lambda: _Check(known, True, state))
    return state
