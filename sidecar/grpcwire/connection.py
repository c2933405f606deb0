"""The server side of one HTTP/2 connection carrying gRPC calls, as an asyncio protocol:
its life (accepted or refused at the connection cap, served, told to go away, closed) and
what ends it (a protocol violation: GOAWAY with its error code; a bug of ours: GOAWAY
INTERNAL_ERROR; both logged at a limited rate).

Why not grpc.aio: Envoy opens one ext_proc stream per HTTP request, and grpc.aio spends
most of the sidecar's CPU on per-stream machinery (a task per call, completion-queue hops,
several awaits per message). Here a read is parsed in place, each complete message goes
straight to its method's synchronous handler, and everything the read produced leaves in one
write. Measured in bench/side_by_side.py; see docs/performance.md.

`Connection` is assembled from mixins, one job each, that share this one object's state
(a mixin costs nothing per call; a helper object would cost an attribute hop per frame):

- reading.py (FrameReader): socket reads into frames; every frame but DATA;
- message_splitting.py (MessageSplitter): the DATA path, messages to their handlers;
- call_lifecycle.py (CallLifecycle): opening, dispatching to and ending calls;
- receive_credit.py (ReceiveCredit): receive flow control, buffer reservations;
- timers.py (ConnectionTimers): handshake and idle timers, the grace of a close;
- sending.py (FrameWriter): what we send, its flow control, one write per read.

Scope: plaintext HTTP/2 (h2c with prior knowledge) as gRPC clients and Envoy speak it, flow
control in both directions, PING, SETTINGS, RST_STREAM, GOAWAY, CONTINUATION, padding.
The port is a trust boundary (docs/grpc-server.md).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.call_lifecycle import CallLifecycle
from sidecar.grpcwire.flood import Budget, FloodError
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.message_splitting import MessageSplitter
from sidecar.grpcwire.reading import FrameReader
from sidecar.grpcwire.receive_credit import ReceiveCredit
from sidecar.grpcwire.sending import FrameWriter
from sidecar.grpcwire.timers import ConnectionTimers

if TYPE_CHECKING:
    from sidecar.grpcwire.server import GrpcServer


class Connection(FrameReader, MessageSplitter, CallLifecycle, ReceiveCredit, ConnectionTimers,
                 FrameWriter, asyncio.Protocol):
    def __init__(self, server: GrpcServer,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Without `loop` (tests on a fake transport) there are no timers."""
        super().__init__()
        self._server = server
        limits = self._limits = server.limits
        self._counters = server.counters
        self._peer = "?"
        self.going_away = False
        self._refused = False
        # What a peer without the channel token may cost (flood.py, call_lifecycle.py).
        self._authenticated = server.auth is None
        self._unauthenticated_calls = 0
        # Whether a call other than health has come on this connection (with the channel
        # token, when one is required): one of Envoy's connections (GrpcServer.peers_open).
        self.carries_peer_calls = False
        self._open_method_calls = 0
        clock = self._clock = server.clock
        now = clock()
        burst, rate = limits.flood_burst, limits.flood_rate
        self._ping_budget = Budget(burst, rate, now)
        self._settings_budget = Budget(burst, rate, now)
        self._reset_budget = Budget(burst, rate, now)
        self._empty_budget = Budget(burst, rate, now)
        self._init_reading(limits)
        self._init_credit(limits)
        self._init_timers(loop)

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server, limits = self._server, self._limits
        if len(server.connections) >= limits.max_connections:
            self._refused = True
            self._counters.connections_refused += 1
            self._transport.close()
            self._transport = None
            return
        server.connections.add(self)
        self._counters.connections_open += 1
        self._peer = _peer_name(transport)
        if not self._authenticated:
            waiting = server.unauthenticated
            waiting[self] = None
            if len(waiting) > limits.max_unauthenticated_connections:
                next(iter(waiting))._evict()
        self._out += f.settings({
            f.SETTINGS_ENABLE_PUSH: 0,
            f.SETTINGS_MAX_CONCURRENT_STREAMS: limits.max_concurrent_calls,
            f.SETTINGS_INITIAL_WINDOW_SIZE: limits.stream_window,
            f.SETTINGS_MAX_FRAME_SIZE: limits.max_frame_bytes,
            f.SETTINGS_MAX_HEADER_LIST_SIZE: limits.max_header_block_bytes,
        })
        if limits.connection_window > f.DEFAULT_WINDOW:
            self._out += f.window_update(0, limits.connection_window - f.DEFAULT_WINDOW)
        self._flush()
        self._start_handshake_timer()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        self._reading = True
        try:
            self._receive(data)
        except FloodError as error:
            self._calm(str(error))
        except ProtocolError as error:
            self._counters.protocol_errors += 1
            self._server.log.warning("protocol", "closing gRPC connection from %s: %s",
                                     self._peer, error)
            self._out += f.goaway(self._last_stream_id, error.code, str(error).encode()[:200])
            self._close()
        except Exception:
            self._counters.internal_errors += 1
            self._server.log.exception("internal", "closing gRPC connection from %s after an "
                                       "internal error", self._peer)
            self._out += f.goaway(self._last_stream_id, f.INTERNAL_ERROR)
            self._close()
        finally:
            self._reading = False
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._refused:
            return
        self._server.connections.discard(self)
        self._server.unauthenticated.pop(self, None)
        self._counters.connections_open -= 1
        calls, self._calls = self._calls, {}
        self._blocked.clear()
        for call in calls.values():
            self._cancel(call)
        self._transport = None

    def _spend(self, budget: Budget, what: str) -> None:
        """One frame of a kind with a flood budget (flood.py)."""
        if not budget.take(self._clock()):
            raise FloodError(f"too many {what}")

    def _calm(self, reason: str) -> None:
        """End the connection for a spent budget: GOAWAY ENHANCE_YOUR_CALM."""
        if self._transport is None or self._transport.is_closing():
            return
        self._counters.flood_closed += 1
        self._server.log.warning("flood", "closing gRPC connection from %s: %s", self._peer,
                                 reason)
        self.going_away = True
        self._out += f.goaway(self._last_stream_id, f.ENHANCE_YOUR_CALM, reason.encode()[:200])
        self._close()

    def _evict(self) -> None:
        """Make room for a newer unauthenticated connection (max_unauthenticated_connections)."""
        self._server.unauthenticated.pop(self, None)
        if self._transport is None or self._transport.is_closing():
            return
        self._counters.connections_evicted += 1
        self.going_away = True
        self._out += f.goaway(self._last_stream_id, f.ENHANCE_YOUR_CALM,
                              b"too many connections without the channel token")
        self._close()

    def pause_writing(self) -> None:  # the peer is not reading: stop reading from it
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    # --- used by the server -----------------------------------------------------------

    def go_away(self) -> None:
        """Graceful stop: no new calls; those in flight may finish."""
        if not self.going_away and self._transport is not None:
            self.going_away = True
            self._out += f.goaway(self._last_stream_id, f.NO_ERROR)
            self._flush()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # --- closing ----------------------------------------------------------------------

    def _close(self) -> None:
        """Close after what is queued has left; a peer that does not read gets the
        handshake timeout to take it, then the connection is cut."""
        self._flush()
        if self._transport is not None:
            self._transport.close()
            self._cut_after_grace(self._transport)


def _peer_name(transport: asyncio.BaseTransport) -> str:
    get = getattr(transport, "get_extra_info", None)
    peer = get("peername") if get is not None else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
