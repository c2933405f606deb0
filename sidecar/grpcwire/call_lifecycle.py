"""A call's life on the server side: opened by its request header block (routed,
authenticated, or refused before any handler exists), fed to its handler, and ended, by
the client (half-close, reset, the connection lost) or on the server's own account (a
handler failure, an undecodable or oversize message, no buffer room, a truncated message).

Its own module because this is where the handler contract lives (docs/grpc-server.md,
"How"): a handler hears exactly one of a clean half-close or a cancel, an exception ends
only its own call, and a client still sending to a call we ended is asked to stop. Frames
are parsed elsewhere (reading.py, message_splitting.py); they call in here.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.buffers import consume
from sidecar.grpcwire.call import (
    INTERNAL,
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED,
    UNAUTHENTICATED,
    UNIMPLEMENTED,
    Call,
    Handler,
    UndecodableMessage,
)
from sidecar.grpcwire.flood import FloodError
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.headers import check_trailers

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from sidecar.grpcwire.counters import ServerCounters
    from sidecar.grpcwire.headers import HeaderDecoder
    from sidecar.grpcwire.limits import ServerLimits
    from sidecar.grpcwire.server import GrpcServer

_NO_ROUTE = (None, 0, False)  # an unknown method: (factory, message limit, open)


class CallLifecycle:
    """Mixin of Connection."""

    # Kept by the rest of Connection.
    _server: GrpcServer
    _limits: ServerLimits
    _counters: ServerCounters
    _calls: dict[int, Call]
    _out: bytearray
    _peer: str
    _headers: HeaderDecoder
    _last_stream_id: int
    _peer_initial_window: int
    _stream_window: int
    _authenticated: bool
    carries_peer_calls: bool
    _unauthenticated_calls: int
    _open_method_calls: int
    _loop: asyncio.AbstractEventLoop | None
    _transport: asyncio.Transport | None
    going_away: bool
    _flush: Callable[[], None]

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        """A whole request header block (HEADERS and any CONTINUATION): a new call, or the
        trailers of one."""
        call = self._calls.get(stream_id)
        if call is not None:  # client trailers: gRPC clients send none, but allow them
            check_trailers(self._headers.decode(block))
            if call.remote_closed:
                raise ProtocolError(f.STREAM_CLOSED, "HEADERS after END_STREAM")
            if not flags & f.END_STREAM:
                raise ProtocolError(f.PROTOCOL_ERROR, "trailers without END_STREAM")
            call.remote_closed = True
            if not call.finished:
                if call.inbox:
                    self._incomplete(call)
                else:
                    self._dispatch(call, None)
            return
        if stream_id % 2 == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "even stream id from a client")
        if stream_id <= self._last_stream_id:
            self._headers.decode(block)  # (the HPACK table follows every block)
            if not flags & f.END_STREAM:
                raise ProtocolError(f.PROTOCOL_ERROR, "a new stream id must be larger")
            return  # trailers of a call we already finished
        path, token = self._headers.request(block)
        self._last_stream_id = stream_id
        if self.going_away or len(self._calls) >= self._limits.max_concurrent_calls:
            if not self._authenticated:
                self._count_unauthenticated()
            self._out += f.rst_stream(stream_id, f.REFUSED_STREAM)
            return
        server = self._server
        factory, max_message, open_method = server.routes.get(path, _NO_ROUTE)
        call = Call(self, stream_id, self._peer_initial_window, self._stream_window, path,
                    max_message)
        self._calls[stream_id] = call
        if flags & f.END_STREAM:
            call.remote_closed = True
        if open_method:
            auth = server.auth
            if not self._authenticated and auth is not None and auth.carries_token(token):
                self._authenticate()
            if not self._open_call(call, factory):
                return
        else:
            auth = server.auth
            if auth is not None:
                if not auth.allows(path, token):
                    self._counters.unauthenticated_calls += 1  # never logged: counted
                    self._count_unauthenticated()
                    self._refuse(call, UNAUTHENTICATED, "missing or wrong channel token")
                    return
                if not self._authenticated:
                    self._authenticate()
            if not self.carries_peer_calls:
                self.carries_peer_calls = True
                server.peers_seen += 1
        if factory is None:
            self._refuse(call, UNIMPLEMENTED, f"unknown method {path[:200].decode('latin-1')}")
            return
        try:
            call.handler = factory()
        except Exception:
            self._counters.handler_errors += 1
            server.log.exception("handler", "gRPC handler of %s could not start", _name(call))
            self._refuse(call, INTERNAL, "internal error")
            return
        if open_method:
            call.handler = _OneMessage(self, call.handler)
        if call.remote_closed:
            self._dispatch(call, None)

    # --- calls without the channel token: their own small budget -------------------------

    def _authenticate(self) -> None:
        """The connection made a call with the token (Envoy's, health checks included): from
        now on it spends Envoy's budgets, not those of a peer without the token."""
        self._authenticated = True
        self._server.unauthenticated.pop(self, None)  # type: ignore[call-overload]

    def _count_unauthenticated(self) -> None:
        """A call without the token on a connection that has made no authenticated one
        (Envoy makes none, health checks included): past `max_unauthenticated_calls`, GOAWAY
        ENHANCE_YOUR_CALM."""
        self._unauthenticated_calls += 1
        if self._unauthenticated_calls > self._limits.max_unauthenticated_calls:
            raise FloodError("too many calls without the channel token")

    def _open_call(self, call: Call, factory: object) -> bool:
        """A call of an open method (health): at most `max_open_method_calls` at once on
        the connection, and `open_method_timeout` to deliver its one request message."""
        if not self._authenticated:
            self._count_unauthenticated()
        if self._open_method_calls >= self._limits.max_open_method_calls:
            self._counters.calls_resource_exhausted += 1
            self._refuse(call, RESOURCE_EXHAUSTED, "too many health calls at once")
            return False
        if factory is None:
            return True
        call.open_method = True
        self._open_method_calls += 1
        if self._loop is not None:
            call.deadline = self._loop.call_later(self._limits.open_method_timeout,
                                                  partial(self._open_call_expired, call))
        return True

    def _open_call_expired(self, call: Call) -> None:
        """An open-method call has not answered (so has not had its request message) by
        its deadline: it ends, and whatever it reserved goes."""
        call.deadline = None
        if call.finished or call.headers_sent or self._transport is None:
            return
        self._exhausted(call, "no request message in time")
        consume(call, "inbox", len(call.inbox))
        self._flush()

    def _open_call_ended(self, call: Call) -> None:
        """(A FrameWriter hook: an open-method call is finished or cancelled.)"""
        self._open_method_calls -= 1
        deadline = call.deadline
        if deadline is not None:
            call.deadline = None
            deadline.cancel()  # type: ignore[attr-defined]

    def _dispatch(self, call: Call, message: bytes | memoryview | None) -> None:
        """Hand a message (or the client's half-close, None) to the call's handler."""
        handler = call.handler
        if handler is None:
            return
        try:
            if message is None:
                handler.on_half_close(call)
            else:
                handler.on_message(call, message)
        except (UndecodableMessage, DecodeError) as error:
            self._counters.invalid_messages += 1
            self._server.log.warning("message", "gRPC call %s from %s: undecodable message "
                                     "(%s)", _name(call), self._peer, error)
            self._end(call, INVALID_ARGUMENT, "undecodable message")
        except Exception:
            self._counters.handler_errors += 1
            self._server.log.exception("handler", "gRPC handler of %s failed", _name(call))
            self._end(call, INTERNAL, "internal error")

    def _end(self, call: Call, status: int, message: str) -> None:
        """End a call on the server's own account; its handler hears of it as a cancel. A
        client still sending is asked to stop (RST_STREAM NO_ERROR after the trailers)."""
        if not call.finished:
            call.finish(status, message)
            self._stop_sending(call)
            self._tell_cancelled(call)

    def _refuse(self, call: Call, status: int, message: str) -> None:
        """Answer a new call with a trailers-only response; no handler hears of it."""
        call.finish(status, message)
        self._stop_sending(call)

    def _stop_sending(self, call: Call) -> None:
        if not call.remote_closed and call.pending_trailers is None:
            call.remote_closed = True
            self._out += f.rst_stream(call.id, f.NO_ERROR)

    def _exhausted(self, call: Call, reason: str) -> None:
        self._counters.calls_resource_exhausted += 1
        self._server.log.warning("resource", "gRPC call %s from %s ended: %s", _name(call),
                                 self._peer, reason)
        self._end(call, RESOURCE_EXHAUSTED, reason)

    def _incomplete(self, call: Call) -> None:
        """The client ended its side inside a message."""
        self._counters.incomplete_messages += 1
        self._end(call, INTERNAL, "incomplete message")
        consume(call, "inbox", len(call.inbox))

    def _cancel(self, call: Call) -> None:
        """The peer ended the call (reset, or the connection is gone)."""
        if call.reserved:
            self._release(call)
        consume(call, "inbox", len(call.inbox))
        if not call.finished:
            call.finished = True
            if call.open_method:
                self._open_call_ended(call)
            self._tell_cancelled(call)

    def _tell_cancelled(self, call: Call) -> None:
        if call.handler is not None:
            try:
                call.handler.on_cancel()
            except Exception:
                self._counters.handler_errors += 1
                self._server.log.exception("handler", "gRPC handler of %s failed on cancel",
                                           _name(call))


class _OneMessage:
    """An open-method call takes exactly one request message: a second one ends it
    (INVALID_ARGUMENT; the client is told to stop sending)."""

    __slots__ = ("_connection", "_handler", "_seen")

    def __init__(self, connection: CallLifecycle, handler: Handler | None) -> None:
        self._connection = connection
        self._handler = handler
        self._seen = False

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        if self._seen:
            self._connection._end(call, INVALID_ARGUMENT, "one request message per call")
            return
        self._seen = True
        if self._handler is not None:
            self._handler.on_message(call, payload)

    def on_half_close(self, call: Call) -> None:
        if self._handler is not None:
            self._handler.on_half_close(call)

    def on_cancel(self) -> None:
        if self._handler is not None:
            self._handler.on_cancel()


def _name(call: Call) -> str:
    return call.method[:200].decode("latin-1")
