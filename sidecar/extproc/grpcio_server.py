"""The escape hatch: the sidecar's gRPC port served by grpcio (`--grpc-server grpcio`)
instead of the sidecar's own HTTP/2 code (sidecar/grpcwire/).

The same synchronous handlers run here (ext_proc's `ProcessStream`, the access-log
receiver's stream, grpc.health.v1): each call is a grpc.aio coroutine on the event loop's
thread that reads a message, hands it to its handler, and writes what the handler sent. So
handlers run one at a time, on one thread, exactly as under the own server; the sidecar's
routing state needs no lock. grpc.aio rather than grpcio's thread-pool server: measured per
routed request, the thread pool cost 1.5x the CPU of grpc.aio (every message crosses
threads and the GIL) and 1.6x its memory, and every long-lived access-log stream would hold
a pool thread for good. Either costs far more than the own server (bench/grpc_server_cost.py;
docs/grpc-server.md, "grpcio instead of the own server").

What the adapter keeps from the own server: the method table, the channel token checked
before a call reaches its handler (health stays open, with a bound on its reads), the
message limit, the limits gRPC core has options for, handler errors ending only their call,
and the counters the admin /status shows (zeros where grpcio cannot tell). What grpcio
cannot enforce is listed in docs/grpc-server.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from sidecar.grpcwire.auth import CHANNEL_TOKEN_HEADER, OPEN_METHODS, ChannelAuth
from sidecar.grpcwire.call import (
    INTERNAL,
    INVALID_ARGUMENT,
    OK,
    RESOURCE_EXHAUSTED,
    HandlerFactory,
    UndecodableMessage,
)
from sidecar.grpcwire.counters import ServerCounters
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.ratelimit import LogLimiter

log = logging.getLogger("sidecar.grpcio")

_STATUS = {code.value[0]: code for code in grpc.StatusCode}
# Reads waiting at once on the methods open without the channel token (health). gRPC core
# takes in a whole message, up to the port's message limit (33 MiB by default), before the
# adapter sees a byte of it, and grants the peer flow-control credit for it; it has no
# smaller limit per method. So an unauthenticated peer could make it hold that much per
# open call: at most this many such reads wait at once. A further one makes room by ending
# the oldest waiting read (RESOURCE_EXHAUSTED), so calls that never send their message cannot
# lock probes out; a probe's Check is read in microseconds.
OPEN_METHOD_READS = 4
# Seconds an open-method read may wait for its message; then the call ends with
# RESOURCE_EXHAUSTED.
OPEN_METHOD_READ_TIMEOUT = 1.0


if TYPE_CHECKING:
    from sidecar.grpcwire.health import HealthState

class GrpcioCall:
    """The grpcwire `Call` interface for one grpcio call: what a handler sends is queued
    and written by the call's coroutine as soon as the handler returns (it cannot be written
    from inside the synchronous handler)."""

    __slots__ = ("deferred", "details", "finished", "id", "method", "outbox", "status",
                 "waiter")

    def __init__(self, method: bytes, call_id: int) -> None:
        self.method = method
        self.id = call_id
        self.outbox: list[bytes] = []
        self.finished = False
        self.status = OK
        self.details = ""
        # Set while the coroutine waits for a send or finish made outside a handler's turn
        # (after the client's half-close, e.g. health Watch).
        self.waiter: asyncio.Future[None] | None = None
        # The handler answers later from a task: wait for its send instead of reading.
        self.deferred = False

    def send(self, message: bytes) -> None:
        """Send one response message (serialized protobuf)."""
        if not self.finished:
            self.outbox.append(message)
            self._wake()

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """One response message given as pieces (grpcio takes a message as one bytes object,
        so they are joined here)."""
        if not self.finished:
            self.outbox.append(b"".join(parts))
            self._wake()

    def finish(self, status: int = OK, message: str = "") -> None:
        """End the call with a gRPC status; later sends and finishes are ignored."""
        if not self.finished:
            self.finished = True
            self.status = status
            self.details = message
            self._wake()

    def defer(self) -> None:
        """The handler will answer from a task: the call's coroutine stops reading and
        waits for that answer (the peer sends nothing more until it comes)."""
        self.deferred = True

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class GrpcioServer:
    """Serves handler factories (`add_method`) with grpc.aio. The interface of
    grpcwire.GrpcServer as the sidecar uses it: add_method, start, stop(grace), port,
    counters."""

    def __init__(self, limits: ServerLimits | None = None, *, auth: ChannelAuth | None = None,
                 **overrides: int | float) -> None:
        """As grpcwire.GrpcServer: `limits` with any field overridden by keyword (e.g.
        `max_message_bytes=`); with `auth`, every call but health must carry the channel
        token."""
        limits = limits or ServerLimits()
        self.limits = limits.with_changes(**overrides) if overrides else limits
        self.auth = auth
        self.methods: dict[bytes, HandlerFactory] = {}
        self.counters = ServerCounters()
        # Set by add_health: NOT_SERVING once a drain begins (operations/drain.py).
        self.health: HealthState | None = None
        self.port = 0
        self.open_calls = 0
        self.open_method_reads = 0
        self._open_reads: dict[asyncio.Future[None], None] = {}  # oldest first
        self._log = LogLimiter(log, self.limits.log_burst, self.limits.log_interval,
                               counters=self.counters)
        self._server: grpc.aio.Server | None = None
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._calls = 0

    def add_method(self, service: str, method: str, factory: HandlerFactory) -> None:
        self.methods[f"/{service}/{method}".encode()] = factory

    def options(self) -> list[tuple[str, Any]]:
        """gRPC core's options for the limits it can enforce (docs/grpc-server.md)."""
        limits = self.limits
        return [
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", limits.max_message_bytes),
            ("grpc.max_concurrent_streams", limits.max_concurrent_calls),
            ("grpc.max_allowed_incoming_connections", limits.max_connections),
            ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout * 1000)),
            ("grpc.max_connection_idle_ms", int(limits.idle_timeout * 1000)),
            ("grpc.max_metadata_size", limits.max_header_block_bytes),
            ("grpc.absolute_max_metadata_size", limits.max_header_block_bytes),
            # Ping floods: a peer pinging more often than every 5 minutes while no data
            # flows gets GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings") after 2 strikes
            # (gRPC core's defaults, stated so docs/grpc-server.md can rely on them). The
            # server itself pings a connection only after 2 hours without reads (default).
            # Not set: grpc.http2.max_frame_size and grpc.http2.lookahead_bytes, which
            # grpcio 1.85 ignores for what it announces (4 MiB frames and stream window
            # whatever they say).
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
            ("grpc.http2.max_ping_strikes", 2),
            # A port in use is an error, as with the own server (grpcio's default
            # SO_REUSEPORT would let a second sidecar share it silently).
            ("grpc.so_reuseport", 0),
        ]

    async def start(self, host: str, port: int) -> None:
        """Raises OSError when the address cannot be bound."""
        self._handlers = {path.decode(): grpc.stream_stream_rpc_method_handler(
            self._behaviour(path, factory)) for path, factory in self.methods.items()}
        self._server = grpc.aio.server(handlers=[_Router(self)], options=self.options())
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(target)
        except RuntimeError as exc:  # grpcio's "Failed to bind to address ..."
            self._server = None
            raise OSError(str(exc)) from None
        await self._server.start()
        log.info("the gRPC port %s:%d is served by grpcio %s (--grpc-server grpcio)", host,
                 self.port, grpc.__version__)

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new calls; give calls in flight `grace` seconds, then cancel them."""
        if self._server is not None:
            await self._server.stop(grace or 0)
            self._server = None
            self._log.flush()

    def route(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        """The call's method handler, or the refusal when the channel token is missing or
        wrong (before any handler exists for the call); None: UNIMPLEMENTED."""
        method: str = details.method  # type: ignore[attr-defined]
        handler = self._handlers.get(method)
        if self.auth is None or method.encode() in OPEN_METHODS:
            return handler
        # The token first, for every other method, unknown ones included (no method
        # enumeration without it); a token header given more than once is refused.
        presented = None
        for key, value in details.invocation_metadata:  # type: ignore[attr-defined]
            if key == CHANNEL_TOKEN_HEADER:
                if presented is not None:
                    presented = b""
                    break
                presented = value.encode() if isinstance(value, str) else value
        if self.auth.allows(method.encode(), presented):
            return handler
        self.counters.unauthenticated_calls += 1
        return _REFUSED

    def _behaviour(self, method: bytes, factory: HandlerFactory):
        server = self

        async def serve_call(_requests: object, context: grpc.aio.ServicerContext) -> None:
            server._calls += 1
            call = GrpcioCall(method, server._calls)
            try:
                handler = factory()
            except Exception:
                server._handler_failed("gRPC handler could not start")
                context.set_code(grpc.StatusCode.INTERNAL)
                context.set_details("internal error")
                return
            server.open_calls += 1
            reading = True
            open_method = method in OPEN_METHODS
            try:
                while True:
                    while call.outbox:
                        outbox, call.outbox = call.outbox, []
                        for message in outbox:
                            await context.write(message)
                    if call.finished:
                        break
                    if reading and not call.deferred:
                        if not open_method:
                            payload = await context.read()
                        else:
                            payload = await server._open_read(context)
                            if payload is None:
                                server.counters.calls_resource_exhausted += 1
                                server._end(call, handler, RESOURCE_EXHAUSTED,
                                            "no request message in time")
                                continue
                        if payload is grpc.aio.EOF:
                            # The client's half-close, or gRPC core ended the call itself
                            # (a message over the limit): the handler cannot tell them
                            # apart here, and a status sent by the core stays.
                            reading = False
                            server._dispatch(call, handler, None)
                        else:
                            server._dispatch(call, handler, payload)
                    else:  # half-closed or deferred, not finished: the handler's next move
                        call.waiter = asyncio.get_running_loop().create_future()
                        await call.waiter
                        call.waiter = None
            except BaseException:  # reset by the peer, connection lost, stop, a failed write
                if not call.finished:
                    call.finished = True
                    server._tell_cancelled(handler)
                raise
            finally:
                server.open_calls -= 1
            if call.status != OK:
                context.set_code(_STATUS.get(call.status, grpc.StatusCode.UNKNOWN))
                context.set_details(call.details)

        return serve_call

    async def _open_read(self, context: grpc.aio.ServicerContext) -> Any:
        """Read an open-method call's message: at most OPEN_METHOD_READS at once (a new one
        ends the oldest waiting one), each for at most OPEN_METHOD_READ_TIMEOUT. None: the
        read was ended."""
        waiting = self._open_reads
        if len(waiting) >= OPEN_METHOD_READS:
            oldest = next(iter(waiting))
            del waiting[oldest]
            oldest.set_result(None)
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting[ended] = None
        self.open_method_reads += 1
        read = asyncio.ensure_future(context.read())
        try:
            done, _ = await asyncio.wait((read, ended), timeout=OPEN_METHOD_READ_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.pop(ended, None)
            self.open_method_reads -= 1
            if not read.done():
                read.cancel()
        return read.result() if read in done else None

    def _dispatch(self, call: GrpcioCall, handler: Any, payload: bytes | None) -> None:
        """One message (or the half-close, None) to the handler; its failure ends only this
        call, as under the own server."""
        try:
            if payload is None:
                handler.on_half_close(call)
            else:
                handler.on_message(call, payload)
        except (UndecodableMessage, DecodeError):
            self.counters.invalid_messages += 1
            self._log.warning("undecodable", "gRPC call %s: undecodable message",
                              call.method.decode("latin-1"))
            self._end(call, handler, INVALID_ARGUMENT, "undecodable message")
        except Exception:
            self._handler_failed("gRPC handler failed")
            self._end(call, handler, INTERNAL, "internal error")

    def _end(self, call: GrpcioCall, handler: Any, status: int, details: str) -> None:
        """End a call on the server's own account; its handler hears of it as a cancel."""
        if not call.finished:
            call.outbox.clear()
            call.finish(status, details)
            self._tell_cancelled(handler)

    def _tell_cancelled(self, handler: Any) -> None:
        try:
            handler.on_cancel()
        except Exception:
            self._handler_failed("gRPC handler failed on cancel")

    def _handler_failed(self, message: str) -> None:
        self.counters.handler_errors += 1
        self._log.exception("handler", message)


class _Router(grpc.GenericRpcHandler):
    def __init__(self, server: GrpcioServer) -> None:
        self._server = server

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._server.route(handler_call_details)


async def _refuse(_requests: object, context: grpc.aio.ServicerContext) -> None:
    context.set_code(grpc.StatusCode.UNAUTHENTICATED)
    context.set_details("missing or wrong channel token")


_REFUSED = grpc.stream_stream_rpc_method_handler(_refuse)
