"""Limits, counters, the log rate limiter, timers and flow-control credit."""

from __future__ import annotations

import struct

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire import frames as f
from tests.conformance.clients import AbortableTransport, FakeLoop, FakeTransport
from tests.unit.grpcwire.servers import (
    SERVICE,
    Echo,
    Sender,
    open_call,
)


def test_limits_are_checked_and_scale_with_the_message_size() -> None:
    from sidecar.grpcwire.limits import MiB, ServerLimits
    with pytest.raises(ValueError, match="one message"):
        ServerLimits(max_message_bytes=100 * MiB)
    with pytest.raises(ValueError, match="positive"):
        ServerLimits(idle_timeout=0)
    with pytest.raises(TypeError, match="unknown limits"):
        ServerLimits().with_changes(max_mesage_bytes=1)
    scaled = ServerLimits.for_message_size(100 * MiB)
    assert scaled.connection_buffer_bytes == 2 * (100 * MiB + 5)
    assert scaled.total_buffer_bytes == 4 * (100 * MiB + 5)
    assert ServerLimits.for_message_size(MiB) == ServerLimits(max_message_bytes=MiB)
    # the call the sidecar makes (sidecar/extproc/server.py) keeps working at any body size
    server = GrpcServer(max_message_bytes=1024 * MiB + MiB)
    assert server.limits.connection_buffer_bytes >= 2 * server.limits.max_message_bytes
    assert GrpcServer(idle_timeout=7).limits.idle_timeout == 7
    assert set(GrpcServer().counters.as_dict()) >= {
        "connections_open", "connections_refused", "handshake_timeouts", "idle_closed",
        "protocol_errors", "unauthenticated_calls", "calls_resource_exhausted",
        "buffered_bytes", "log_lines_suppressed"}


def test_the_log_limiter_is_a_token_bucket_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from sidecar.grpcwire.counters import ServerCounters
    from sidecar.grpcwire.ratelimit import LogLimiter

    now = [0.0]
    counters = ServerCounters()
    logger = logging.getLogger("sidecar.grpcwire.test")
    limiter = LogLimiter(logger, burst=3, interval=60, clock=lambda: now[0], counters=counters)
    caplog.set_level(logging.INFO, logger="sidecar.grpcwire.test")
    for n in range(10):
        limiter.warning("a", "a %d", n)
    limiter.warning("b", "b")  # another kind has its own bucket
    assert [r.getMessage() for r in caplog.records] == ["a 0", "a 1", "a 2", "b"]
    assert counters.log_lines_suppressed == 7
    caplog.clear()
    now[0] = 20.0  # one token back (3 per 60 s)
    limiter.warning("a", "a again")
    limiter.warning("a", "a dropped")
    assert [r.getMessage() for r in caplog.records] == [
        "suppressed 7 similar messages (a)", "a again"]
    caplog.clear()
    limiter.flush()
    assert [r.getMessage() for r in caplog.records] == ["suppressed 1 similar messages (a)"]
    caplog.clear()
    now[0] = 1000.0
    try:
        raise RuntimeError("bug")
    except RuntimeError:
        limiter.exception("c", "failed")
    assert caplog.records[0].exc_info is not None


def timed_connection(**limits):
    from sidecar.grpcwire.connection import Connection
    server = GrpcServer(max_message_bytes=1 << 20, **limits)
    server.add_method(SERVICE, "Send", Sender)
    loop = FakeLoop()
    connection, transport = Connection(server, loop), AbortableTransport()  # type: ignore[arg-type]
    connection.connection_made(transport)  # type: ignore[arg-type]
    return server, loop, connection, transport


def test_the_handshake_timer_closes_a_silent_connection() -> None:
    server, loop, connection, transport = timed_connection(handshake_timeout=5)
    connection.data_received(f.PREFACE)  # the preface alone is not the handshake
    loop.advance_to(4.9)
    assert not transport.closed
    loop.advance_to(5.0)
    assert transport.aborted and server.counters.handshake_timeouts == 1
    connection.connection_lost(None)
    assert server.counters.connections_open == 0


def test_the_idle_timer_counts_from_the_last_open_call() -> None:
    server, loop, connection, transport = timed_connection(handshake_timeout=5,
                                                            idle_timeout=300)
    loop.advance_to(1)
    connection.data_received(f.PREFACE + f.settings({}))
    loop.advance_to(250)
    Sender.outgoing = []
    open_call(connection, 1)  # Sender never finishes: the call stays open
    loop.advance_to(1000)
    assert not transport.closed and server.counters.handshake_timeouts == 0
    transport.frames()
    connection.data_received(f.rst_stream(1, f.CANCEL))  # idle from t=1000
    loop.advance_to(1299)
    assert not transport.closed
    loop.advance_to(1300)
    assert transport.closed and server.counters.idle_closed == 1
    goaway = transport.frames()[-1]
    assert goaway[0] == f.GOAWAY and struct.unpack_from(">II", goaway[3]) == (1, f.NO_ERROR)
    # a peer that does not read what is queued gets the handshake timeout, then is cut
    assert not transport.aborted
    loop.advance_to(1305)
    assert transport.aborted


def _credit(frames, stream_id: int) -> int:
    return sum(struct.unpack(">I", p)[0] for kind, _, s, p in frames
               if kind == f.WINDOW_UPDATE and s == stream_id)


def test_credit_comes_back_as_messages_are_consumed_or_reserved() -> None:
    """Windows of 64 KiB: a 200,005-byte message gets the credit for all of itself when
    its prefix arrives (it is reserved whole), and its later bytes earn nothing; whole
    messages earn their bytes back once dispatched, half a window at a time."""
    from sidecar.grpcwire.connection import Connection
    server = GrpcServer(max_message_bytes=1 << 20, stream_window=65_535,
                        connection_window=65_535)
    server.add_method(SERVICE, "Send", Sender)
    connection, transport = Connection(server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(f.PREFACE + f.settings({}))
    transport.frames()
    Sender.outgoing, Sender.received = [], []
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", f"/{SERVICE}/Send"), (":authority", "x")])
    big = bytes(200_000)
    framed = b"\x00" + struct.pack(">I", len(big)) + big
    connection.data_received(f.frame(f.HEADERS, f.END_HEADERS, 1, block)
                             + f.frame(f.DATA, 0, 1, framed[:1_005]))
    frames = transport.frames()
    assert _credit(frames, 0) == _credit(frames, 1) == 200_005
    assert server.counters.buffered_bytes == 200_005
    for start in range(1_005, len(framed), 16_000):
        connection.data_received(f.frame(f.DATA, 0, 1, framed[start:start + 16_000]))
    assert Sender.received == [big]
    assert _credit(transport.frames(), 0) == 0  # all of it was granted up front
    assert server.counters.buffered_bytes == 0
    small = b"\x00" + struct.pack(">I", 9_995) + bytes(9_995)  # 10,000 bytes
    for _ in range(3):
        connection.data_received(f.frame(f.DATA, 0, 1, small))
    assert _credit(transport.frames(), 0) == 0  # 30,000 < half the window
    connection.data_received(f.frame(f.DATA, 0, 1, small))
    frames = transport.frames()
    assert _credit(frames, 0) == _credit(frames, 1) == 40_000


def test_a_message_that_does_not_fit_ends_its_call_and_earns_its_bytes_back() -> None:
    from sidecar.grpcwire.connection import Connection
    server = GrpcServer(max_message_bytes=600_000, connection_buffer_bytes=1_000_000,
                        connection_window=65_535)
    server.add_method(SERVICE, "Send", Sender)
    connection, transport = Connection(server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(f.PREFACE + f.settings({}))
    transport.frames()
    before = Sender.cancelled
    encoder = hpack.Encoder()
    for stream_id in (1, 3):
        block = encoder.encode([(":method", "POST"), (":scheme", "http"),
                                (":path", f"/{SERVICE}/Send"), (":authority", "x")])
        connection.data_received(
            f.frame(f.HEADERS, f.END_HEADERS, stream_id, block)
            + f.frame(f.DATA, 0, stream_id, b"\x00" + struct.pack(">I", 500_000) + bytes(20_000)))
    frames = transport.frames()
    assert server.counters.buffered_bytes == 500_005
    assert server.counters.calls_resource_exhausted == 1
    assert Sender.cancelled == before + 1
    assert (f.RST_STREAM, 0, 3, struct.pack(">I", f.NO_ERROR)) in frames
    assert _credit(frames, 0) == 500_005  # stream 1's whole message; nothing for stream 3
    # stream 3's bytes were discarded, and so are those still in flight: together they
    # make half a window, which goes back to the peer
    connection.data_received(f.frame(f.DATA, 0, 3, bytes(20_000)))
    assert _credit(transport.frames(), 0) == 40_005
    connection.connection_lost(None)
    assert server.counters.buffered_bytes == 0 and server.counters.connections_open == 0


class _Peer:
    """A conformant client on a fake transport: sends only what the windows the server
    granted allow, and stops sending on a stream the server reset."""

    def __init__(self, limits: dict[str, int]) -> None:
        from sidecar.grpcwire.connection import Connection
        self.server = GrpcServer(**limits)
        self.server.add_method(SERVICE, "Echo", Echo)
        self.connection, self.transport = Connection(self.server), FakeTransport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.encoder = hpack.Encoder()
        self.conn_window = f.DEFAULT_WINDOW
        self.initial = f.DEFAULT_WINDOW
        self.windows: dict[int, int] = {}
        self.pending: dict[int, memoryview] = {}  # what each stream has left to send
        self.done: set[int] = set()
        self.next_id = 1
        self.take()
        self.send(f.PREFACE + f.settings({}))

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)
        self.take()

    def take(self) -> None:
        """Read what the server wrote; acknowledge what it sent (a client reads)."""
        received = 0
        for kind, flags, stream, payload in self.transport.frames():
            assert kind != f.GOAWAY, payload
            if kind == f.SETTINGS and payload:
                for offset in range(0, len(payload), 6):
                    key, value = struct.unpack_from(">HI", payload, offset)
                    if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                        self.initial = value
            elif kind == f.WINDOW_UPDATE and stream == 0:
                self.conn_window += struct.unpack(">I", payload)[0]
            elif kind == f.WINDOW_UPDATE:
                self.windows[stream] += struct.unpack(">I", payload)[0]
            elif kind == f.RST_STREAM or (kind == f.HEADERS and flags & f.END_STREAM):
                self.done.add(stream)  # (a gRPC client stops sending once it has a status)
            elif kind == f.DATA and payload:
                received += len(payload)
                self.connection.data_received(f.window_update(stream, len(payload)))
        if received:
            self.connection.data_received(f.window_update(0, received))
            self.take()

    def open(self, sizes: list[int]) -> None:
        stream_id, self.next_id = self.next_id, self.next_id + 2
        self.windows[stream_id] = self.initial
        self.pending[stream_id] = memoryview(b"".join(
            b"\x00" + struct.pack(">I", size) + bytes(size) for size in sizes))
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"),
                                     (":path", f"/{SERVICE}/Echo"), (":authority", "x")])
        self.send(f.frame(f.HEADERS, f.END_HEADERS, stream_id, block))

    def push(self, stream_id: int, amount: int, end: bool) -> None:
        if stream_id in self.done:
            return
        rest = self.pending[stream_id]
        amount = min(amount, len(rest), self.conn_window, self.windows[stream_id], 16_384)
        end = end and amount == len(rest)
        if amount <= 0 and not end:
            return
        self.conn_window -= amount
        self.windows[stream_id] -= amount
        self.pending[stream_id] = rest[amount:]
        if end:
            self.done.add(stream_id)
        self.send(f.frame(f.DATA, f.END_STREAM if end else 0, stream_id, bytes(rest[:amount])))

    def reset(self, stream_id: int) -> None:
        if stream_id not in self.done:
            self.done.add(stream_id)
            self.send(f.rst_stream(stream_id, f.CANCEL))

    def check(self) -> None:
        connection, counters = self.connection, self.server.counters
        limits = self.server.limits
        calls = list(connection._calls.values())
        # the server's view of every window is the peer's
        assert connection._recv_window == self.conn_window
        for call in calls:
            if call.id not in self.done:
                assert call.recv_window == self.windows[call.id]
        # what is held is reserved, and what is reserved is capped
        reserved = sum(call.reserved for call in calls)
        assert counters.buffered_bytes == connection._reserved == reserved
        assert reserved <= limits.connection_buffer_bytes
        for call in calls:
            assert len(call.inbox) <= max(call.reserved, 4)
        # and never a deadlock: the peer can always finish every reserved message
        expected = {call.id: call.expected for call in calls if call.expected}
        assert self.conn_window >= sum(expected.values())
        for stream_id, count in expected.items():
            assert self.windows[stream_id] >= count


_op = st.one_of(
    st.tuples(st.just("open"), st.lists(st.integers(0, 120_000), min_size=1, max_size=3)),
    st.tuples(st.just("push"), st.integers(0, 7), st.integers(1, 40_000), st.booleans()),
    st.tuples(st.just("reset"), st.integers(0, 7)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_op, min_size=1, max_size=40))
def test_credit_and_reservations_stay_consistent_for_a_conformant_peer(ops) -> None:
    """Whatever a conformant peer does (windows of 64 KiB, messages up to 120,000 bytes
    against a 100,000 limit, a 250,000-byte buffer cap): both sides agree on every window,
    what is held is reserved and capped, and reserved messages can always be finished."""
    peer = _Peer({"max_message_bytes": 100_000, "connection_buffer_bytes": 250_000,
                  "stream_window": 65_535, "connection_window": 65_535})
    for op in ops:
        opened = sorted(peer.pending)
        if op[0] == "open":
            peer.open(op[1])
        elif op[0] == "push" and opened:
            peer.push(opened[op[1] % len(opened)], op[2], op[3])
        elif op[0] == "reset" and opened:
            peer.reset(opened[op[1] % len(opened)])
        peer.check()
    # pushing everything that is left finishes every call the server still takes
    for _ in range(200):
        for stream_id in sorted(peer.pending):
            peer.push(stream_id, 16_384, True)
        peer.check()
    assert all(stream_id in peer.done for stream_id in peer.pending)
    peer.connection.connection_lost(None)
    assert peer.server.counters.buffered_bytes == 0
