"""The sidecar's own gRPC server, exercised by the official grpcio client (and, for protocol
corner cases, by raw HTTP/2 frames): streaming in both directions, flow control with messages
far larger than any window, errors, cancellation and graceful stop."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.grpcwire import Call, GrpcServer
from sidecar.grpcwire import frames as f
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.headers import HeaderDecoder
from sidecar.grpcwire.health import add_health
from tests.conformance.clients import AbortableTransport, FakeLoop, FakeTransport
from tests.conformance.clients import fake_connection as conformance_connection

SERVICE = "test.Echo"


class Echo:
    """Echoes each message; finishes on half-close; `boom` raises; `stop` finishes early."""

    cancelled = 0

    def on_message(self, call: Call, payload: bytes) -> None:
        if payload == b"boom":
            raise RuntimeError("handler failure")
        call.send(payload)
        if payload == b"stop":
            call.finish()

    def on_half_close(self, call: Call) -> None:
        call.finish()

    def on_cancel(self) -> None:
        Echo.cancelled += 1


class Collect:
    """Client streaming: answers with the total byte count when the client is done."""

    def __init__(self) -> None:
        self.total = 0

    def on_message(self, call: Call, payload: bytes) -> None:
        self.total += len(payload)

    def on_half_close(self, call: Call) -> None:
        call.send(str(self.total).encode())
        call.finish()

    def on_cancel(self) -> None:
        pass


class Running:
    def __init__(self, max_message: int = 64 * 1024 * 1024, **limits: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = GrpcServer(max_message_bytes=max_message, **limits)
        self.server.add_method(SERVICE, "Echo", Echo)
        self.server.add_method(SERVICE, "Collect", Collect)
        self.health = add_health(self.server, ["test.Echo"])
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture()
def running() -> Iterator[Running]:
    server = Running()
    yield server
    server.close()


def identity(x: bytes) -> bytes:
    return x


def bidi(channel: grpc.Channel, name: str = "Echo"):
    return channel.stream_stream(f"/{SERVICE}/{name}", request_serializer=identity,
                                 response_deserializer=identity)


def test_health_check_serving_and_unknown(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "test.Echo"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_the_status(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        stream.cancel()


def test_a_drain_turns_health_not_serving_for_checks_and_watchers(running: Running) -> None:
    """operations/drain.py: the first step of a drain, announced on open Watch calls."""
    with grpc.insecure_channel(running.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING

        async def drain() -> None:
            running.health.stop_serving()

        running.call(drain())
        assert next(stream).status == health_pb2.HealthCheckResponse.NOT_SERVING
        stream.cancel()
        reply = stub.Check(health_pb2.HealthCheckRequest(service="test.Echo"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_bidi_stream_echoes_in_order_and_finishes_on_half_close(running: Running) -> None:
    messages = [f"message {n}".encode() for n in range(50)]
    with grpc.insecure_channel(running.address) as channel:
        assert list(bidi(channel)(iter(messages), timeout=5)) == messages


def test_handler_may_finish_before_the_client_is_done(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        replies = list(bidi(channel)(iter([b"a", b"stop"]), timeout=5))
    assert replies == [b"a", b"stop"]


def test_messages_larger_than_every_window_flow_both_ways(running: Running) -> None:
    """20 MiB each way: beyond our 16 MiB stream window and grpcio's own windows, so both
    sides' flow control (and our queued sending) must work."""
    big = bytes(range(256)) * (20 * 1024 * 4)
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
               ("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(running.address, options=options) as channel:
        replies = list(bidi(channel)(iter([big, b"small", big]), timeout=30))
    assert [len(r) for r in replies] == [len(big), 5, len(big)]
    assert replies[0] == big and replies[2] == big


def test_client_streaming_gets_one_answer_at_the_end(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        collect = channel.stream_unary(f"/{SERVICE}/Collect", request_serializer=identity,
                                       response_deserializer=identity)
        assert collect(iter([b"x" * 1000] * 300), timeout=5) == b"300000"


def test_many_concurrent_calls(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        echo = bidi(channel)
        futures = []
        results: list[list[bytes]] = []

        def one(n: int) -> None:
            results.append(list(echo(iter([str(n).encode()] * 3), timeout=10)))

        futures = [threading.Thread(target=one, args=(n,)) for n in range(64)]
        for thread in futures:
            thread.start()
        for thread in futures:
            thread.join()
    assert sorted(r[0] for r in results) == sorted(str(n).encode() for n in range(64))
    assert all(len(set(r)) == 1 and len(r) == 3 for r in results)


def test_unknown_method_is_unimplemented(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel, \
            pytest.raises(grpc.RpcError) as error:
        list(bidi(channel, "Nope")(iter([b"x"]), timeout=5))
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_handler_exception_ends_only_that_call_with_internal(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        with pytest.raises(grpc.RpcError) as error:
            list(bidi(channel)(iter([b"boom"]), timeout=5))
        assert error.value.code() == grpc.StatusCode.INTERNAL
        assert list(bidi(channel)(iter([b"still here"]), timeout=5)) == [b"still here"]


def test_message_over_the_limit_is_resource_exhausted() -> None:
    server = Running(max_message=1024)
    try:
        with grpc.insecure_channel(server.address) as channel, \
                pytest.raises(grpc.RpcError) as error:
            list(bidi(channel)(iter([b"x" * 2048]), timeout=5))
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.close()


def test_client_cancel_reaches_the_handler(running: Running) -> None:
    before = Echo.cancelled
    release = threading.Event()

    def requests():
        yield b"first"
        release.wait(10)  # keep the call open (no half-close) until cancelled

    with grpc.insecure_channel(running.address) as channel:
        call = bidi(channel)(requests(), timeout=10)
        assert next(call) == b"first"
        call.cancel()
        deadline = time.monotonic() + 5
        while Echo.cancelled == before and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
    assert Echo.cancelled == before + 1
    assert all(c.open_calls == 0 for c in running.server.connections)


def test_stop_refuses_new_connections(running: Running) -> None:
    running.call(running.server.stop(0.1))
    with socket.socket() as sock, pytest.raises(OSError):
        sock.settimeout(1)
        sock.connect(("127.0.0.1", running.server.port))
        sock.sendall(f.PREFACE)
        if not sock.recv(1):
            raise OSError("closed")


# --- raw frames ----------------------------------------------------------------------------

def raw_connection(running: Running) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", running.server.port), timeout=5)
    sock.sendall(f.PREFACE + f.settings({}))
    return sock


def read_frames(sock: socket.socket, until_type: int,
                until_flags: int = 0) -> list[tuple[int, int, int, bytes]]:
    frames, buffer = [], b""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        while len(buffer) >= 9:
            high, low, kind, flags, stream = f.FRAME_HEADER.unpack_from(buffer)
            length = (high << 8) | low
            if len(buffer) < 9 + length:
                break
            frames.append((kind, flags, stream, buffer[9:9 + length]))
            buffer = buffer[9 + length:]
            if kind == until_type and flags & until_flags == until_flags:
                return frames
        chunk = sock.recv(65536)
        if not chunk:
            break
        buffer += chunk
    return frames


def request_block(path: str) -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "x"), ("content-type", "application/grpc"),
                                   ("te", "trailers")])


def test_ping_is_acknowledged(running: Running) -> None:
    with raw_connection(running) as sock:
        sock.sendall(f.frame(f.PING, 0, 0, b"12345678"))
        frames = read_frames(sock, f.PING)
    assert frames[-1] == (f.PING, f.ACK, 0, b"12345678")


def test_headers_split_over_continuation_and_padded_data(running: Running) -> None:
    block = request_block(f"/{SERVICE}/Echo")
    message = b"\x00" + struct.pack(">I", 5) + b"hello"
    padded = bytes([3]) + message + b"\x00\x00\x00"
    with raw_connection(running) as sock:
        sock.sendall(f.frame(f.HEADERS, 0, 1, block[:4])
                     + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[4:])
                     + f.frame(f.DATA, f.PADDED | f.END_STREAM, 1, padded))
        frames = read_frames(sock, f.HEADERS, f.END_STREAM)
    data = [payload for kind, _, stream, payload in frames if kind == f.DATA and stream == 1]
    assert data == [message]
    trailers = [p for kind, flags, _, p in frames if kind == f.HEADERS and flags & f.END_STREAM]
    assert hpack.Decoder().decode(trailers[0]) == [("grpc-status", "0")]


def test_a_bad_preface_closes_the_connection(running: Running) -> None:
    with socket.create_connection(("127.0.0.1", running.server.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        frames = read_frames(sock, f.GOAWAY)
    assert frames and frames[-1][0] == f.GOAWAY


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_after_the_preface_never_breaks_the_server(garbage: bytes) -> None:
    """Whatever arrives, the server answers or closes that connection, and keeps serving."""
    server = _SHARED.get()
    with socket.create_connection(("127.0.0.1", server.server.port), timeout=5) as sock:
        sock.sendall(f.PREFACE + garbage)
        sock.settimeout(0.2)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass
    with grpc.insecure_channel(server.address) as channel:
        assert list(bidi(channel)(iter([b"ok"]), timeout=5)) == [b"ok"]


class _Shared:
    """One server for the property test's many examples."""

    def __init__(self) -> None:
        self._server: Running | None = None

    def get(self) -> Running:
        if self._server is None:
            self._server = Running()
        return self._server


_SHARED = _Shared()


def test_header_memo_follows_the_dynamic_table() -> None:
    """A remembered block must decode as a fresh decoder would, also after another block
    changed the dynamic table: 0xbe (index 62, the newest entry) then means something else."""

    def indexed_literal(name: bytes, value: bytes) -> bytes:  # RFC 7541 §6.2.1, no Huffman
        return b"\x40" + bytes([len(name)]) + name + bytes([len(value)]) + value

    newest = b"\xbe"
    sequence = [indexed_literal(b"x-a", b"1"), newest, newest,
                indexed_literal(b"x-b", b"2"), newest, newest]
    ours, reference = HeaderDecoder(), hpack.Decoder()
    for block in sequence:
        expected = [(bytes(n), bytes(v)) for n, v in reference.decode(block, raw=True)]
        assert ours.decode(block) == expected
    assert ours.decode(newest) == [(b"x-b", b"2")]
    # a table size update to 32 evicts everything: index 62 no longer exists
    ours.decode(b"\x3f\x01")
    with pytest.raises(ProtocolError):
        ours.decode(newest)


def test_calls_beyond_the_concurrency_limit_are_refused() -> None:
    server = Running(max_concurrent_calls=2)
    try:
        with socket.create_connection(("127.0.0.1", server.server.port), timeout=5) as sock:
            sock.sendall(f.PREFACE + f.settings({}))
            encoder = hpack.Encoder()
            for stream_id in (1, 3, 5):  # three calls that stay open (no END_STREAM)
                block = encoder.encode([(":method", "POST"), (":scheme", "http"),
                                        (":path", f"/{SERVICE}/Echo"), (":authority", "x")])
                sock.sendall(f.frame(f.HEADERS, f.END_HEADERS, stream_id, block))
            frames = read_frames(sock, f.RST_STREAM)
        assert frames[-1][:3] == (f.RST_STREAM, 0, 5)
        assert struct.unpack(">I", frames[-1][3])[0] == f.REFUSED_STREAM
    finally:
        server.close()


# --- the connection on a fake transport (review findings) ----------------------------------

class Sender:
    """Sends whatever the test puts in `outgoing` when a message arrives; never finishes."""

    outgoing: ClassVar[list[bytes | tuple[bytes | memoryview, ...]]] = []
    received: ClassVar[list[bytes]] = []
    cancelled = 0
    last_call: Call | None = None

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        Sender.last_call = call
        Sender.received.append(bytes(payload))
        for message in Sender.outgoing:
            if isinstance(message, tuple):
                call.send_parts(message)
            else:
                call.send(message)

    def on_half_close(self, call: Call) -> None: ...

    def on_cancel(self) -> None:
        Sender.cancelled += 1


def fake_connection(settings: dict[int, int] | None = None):
    """A connection to a server with the `Send` method, past its handshake."""
    server = GrpcServer(max_message_bytes=1 << 20)
    server.add_method(SERVICE, "Send", Sender)
    connection, transport = conformance_connection(server, handshake=False)
    connection.data_received(f.PREFACE + f.settings(settings or {}))
    transport.frames()
    return connection, transport


def open_call(connection, stream_id: int, message: bytes = b"go") -> None:
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", f"/{SERVICE}/Send"), (":authority", "x")])
    connection.data_received(f.frame(f.HEADERS, f.END_HEADERS, stream_id, block)
                             + f.frame(f.DATA, 0, stream_id,
                                       b"\x00" + struct.pack(">I", len(message)) + message))


def data_of(frames, stream_id: int) -> bytes:
    return b"".join(p for kind, _, s, p in frames if kind == f.DATA and s == stream_id)


def test_a_negative_send_window_queues_everything_and_loses_nothing() -> None:
    """RFC 9113 §6.9.2: lowering SETTINGS_INITIAL_WINDOW_SIZE can make a window negative."""
    connection, transport = fake_connection({f.SETTINGS_INITIAL_WINDOW_SIZE: 1010})
    Sender.outgoing = [b"A" * 1000]  # 1,005 bytes framed: all go, 5 bytes of window left
    open_call(connection, 1)
    sent = data_of(transport.frames(), 1)
    assert len(sent) == 1005
    # the peer lowers the initial window by 15: our window is now -10
    connection.data_received(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 995}))
    Sender.outgoing = [b"B" * 15]
    connection.data_received(f.frame(f.DATA, 0, 1, b"\x00\x00\x00\x00\x01x"))
    assert data_of(transport.frames(), 1) == b""  # nothing may go while the window is < 0
    connection.data_received(f.window_update(1, 22))  # window: 12
    sent += data_of(transport.frames(), 1)
    expected = (b"\x00" + struct.pack(">I", 1000) + b"A" * 1000
                + b"\x00" + struct.pack(">I", 15) + b"B" * 15)
    assert sent == expected[:1005 + 12]
    connection.data_received(f.window_update(1, 100))
    sent += data_of(transport.frames(), 1)
    assert sent == expected


def test_a_message_sent_as_parts_is_framed_across_them_and_waits_for_window() -> None:
    """Body answers go out as pieces (no join); frames span the pieces, never exceed the
    peer's frame size, and what the window holds back follows later, in order."""
    connection, transport = fake_connection({f.SETTINGS_INITIAL_WINDOW_SIZE: 20_000})
    parts = (b"a" * 10_000, memoryview(b"b" * 20_000), b"", b"c" * 5)
    Sender.outgoing = [parts]
    open_call(connection, 1)
    frames = [frame for frame in transport.frames() if frame[0] == f.DATA]
    assert [len(payload) for *_, payload in frames] == [16_384, 3_616]  # the window: 20,000
    connection.data_received(f.window_update(1, 40_000) + f.window_update(0, 40_000))
    frames += [frame for frame in transport.frames() if frame[0] == f.DATA]
    assert all(len(payload) <= 16_384 for *_, payload in frames)
    assert data_of(frames, 1) == (b"\x00" + struct.pack(">I", 30_005)
                                  + b"a" * 10_000 + b"b" * 20_000 + b"c" * 5)


@given(st.lists(st.integers(min_value=0, max_value=40_000), max_size=12))
def test_frames_cut_anywhere_by_the_reads_arrive_whole(cuts: list[int]) -> None:
    """Frames are parsed straight from each read; only a cut-off frame waits for the bytes
    that complete it. Wherever the reads cut, messages and control frames arrive intact."""
    from sidecar.grpcwire.connection import Connection
    server = GrpcServer(max_message_bytes=1 << 20)
    server.add_method(SERVICE, "Send", Sender)
    connection, transport = Connection(server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    message = bytes(range(256)) * 100
    framed = b"\x00" + struct.pack(">I", len(message)) + message
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", f"/{SERVICE}/Send"), (":authority", "x")])
    wire = (f.PREFACE + f.settings({}) + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
            + f.frame(f.DATA, 0, 1, framed[:9_000]) + f.frame(f.PING, 0, 0, b"12345678")
            + f.frame(f.DATA, f.END_STREAM, 1, framed[9_000:]))
    Sender.received, Sender.outgoing = [], []
    points = sorted({0, len(wire), *(cut % len(wire) for cut in cuts)})
    for start, end in itertools.pairwise(points):
        connection.data_received(wire[start:end])
    assert Sender.received == [message]
    assert (f.PING, f.ACK, 0, b"12345678") in transport.frames()


def test_a_send_made_outside_a_socket_read_is_written_at_once() -> None:
    """Answers made while a read is handled leave together at its end; one made later (a
    handler answering from a timer or task) must not wait for the next read."""
    connection, transport = fake_connection()
    Sender.outgoing = []
    open_call(connection, 1)
    assert transport.frames() == []
    assert Sender.last_call is not None
    Sender.last_call.send(b"later")
    assert data_of(transport.frames(), 1) == b"\x00" + struct.pack(">I", 5) + b"later"


def test_a_call_the_server_ends_itself_is_reported_to_its_handler() -> None:
    """An oversize message (or a handler failure) ends the call; the handler must hear of it,
    or per-stream accounting (ext_proc's active_streams) would leak."""
    connection, transport = fake_connection()
    before = Sender.cancelled
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", f"/{SERVICE}/Send"), (":authority", "x")])
    connection.data_received(f.frame(f.HEADERS, f.END_HEADERS, 1, block)
                             + f.frame(f.DATA, 0, 1, b"\x00" + struct.pack(">I", 2 << 20)))
    assert Sender.cancelled == before + 1
    trailers = [p for kind, flags, s, p in transport.frames()
                if kind == f.HEADERS and flags & f.END_STREAM]
    assert ("grpc-status", "8") in hpack.Decoder().decode(trailers[0])
    connection.data_received(f.rst_stream(1, f.CANCEL))  # no second report
    assert Sender.cancelled == before + 1


def test_the_read_buffer_survives_a_view_kept_alive_elsewhere() -> None:
    from sidecar.grpcwire.buffers import consume

    class Owner:
        data = bytearray(b"0123456789")

    owner = Owner()
    view = memoryview(owner.data)  # e.g. held by a logged traceback's frame
    consume(owner, "data", 4)
    assert owner.data == bytearray(b"456789")
    view.release()


def test_a_table_size_update_block_is_never_remembered() -> None:
    def indexed_literal(name: bytes, value: bytes) -> bytes:
        return b"\x40" + bytes([len(name)]) + name + bytes([len(value)]) + value

    ours = HeaderDecoder()
    ours.decode(indexed_literal(b"x-a", b"1"))
    assert ours.decode(b"\xbe") == [(b"x-a", b"1")]
    ours.decode(b"\x20")  # resize to 0: the table is empty now
    with pytest.raises(ProtocolError):
        ours.decode(b"\xbe")


def test_oversized_header_blocks_and_bad_settings_close_the_connection() -> None:
    connection, transport = fake_connection()
    connection.data_received(f.frame(f.HEADERS, 0, 1, b"\x00" * 40_000)
                             + f.frame(f.CONTINUATION, 0, 1, b"\x00" * 40_000))
    assert transport.closed and transport.frames()[-1][0] == f.GOAWAY
    connection, transport = fake_connection()
    connection.data_received(f.settings({f.SETTINGS_MAX_FRAME_SIZE: 100}))
    goaway = transport.frames()[-1]
    assert goaway[0] == f.GOAWAY and struct.unpack_from(">II", goaway[3])[1] == f.PROTOCOL_ERROR


def test_after_the_peer_shrinks_its_table_our_next_block_says_so() -> None:
    connection, transport = fake_connection({f.SETTINGS_HEADER_TABLE_SIZE: 0})
    Sender.outgoing = [b"x"]
    open_call(connection, 1)
    headers = [p for kind, _, _, p in transport.frames() if kind == f.HEADERS]
    assert headers[0][:1] == f.TABLE_SIZE_ZERO
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 0
    assert (":status", "200") in decoder.decode(headers[0])


def test_an_unreadable_ext_proc_message_does_not_leak_an_open_stream() -> None:
    """active_streams (admin /status, the leak tests) must come back to 0 however a stream
    ends, including when the message cannot even be parsed."""
    from sidecar.config import load_config_text
    from sidecar.extproc.processor import METHOD, ExternalProcessor
    from sidecar.extproc.processor import SERVICE as EXT_PROC
    from sidecar.gateway import Gateway, Runtime
    from sidecar.grpcwire.connection import Connection

    config = load_config_text("""
providers:
  p: {base_url: "http://127.0.0.1:9/v1", credential: {env: K}}
callers: [{name: c, token_sha256: "%s"}]
models:
  g: {targets: [{provider: p, model_ref: m}]}
""" % ("0" * 64))
    processor = ExternalProcessor(Gateway(Runtime(config, {"K": "k"})))
    server = GrpcServer()
    server.add_method(EXT_PROC, METHOD, processor.stream)
    connection, transport = Connection(server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", f"/{EXT_PROC}/{METHOD}"), (":authority", "x")])
    garbage = b"\xff\xff\xff"
    connection.data_received(f.PREFACE + f.settings({})
                             + f.frame(f.HEADERS, f.END_HEADERS, 1, block)
                             + f.frame(f.DATA, 0, 1, b"\x00" + struct.pack(">I", 3) + garbage))
    trailers = [p for kind, flags, _, p in transport.frames()
                if kind == f.HEADERS and flags & f.END_STREAM]
    assert ("grpc-status", "3") in hpack.Decoder().decode(trailers[0])  # INVALID_ARGUMENT
    assert processor.active_streams == 0


# --- limits, counters, the log rate limiter, timers, flow-control credit ------------------------

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
