"""A minimal gRPC-over-HTTP/2 server for synchronous handlers (the ext_proc hot path)."""

from sidecar.grpcwire.call import Call, Handler, HandlerFactory, UndecodableMessage
from sidecar.grpcwire.counters import ServerCounters
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.server import GrpcServer

__all__ = ["Call", "GrpcServer", "Handler", "HandlerFactory", "ServerCounters", "ServerLimits",
           "UndecodableMessage"]
