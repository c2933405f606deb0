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
    def __init__(self, max_message: int = 64 * 1024 * 1024) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = GrpcServer(max_message_bytes=max_message)
        self.server.add_method(SERVICE, "Echo", Echo)
        self.server.add_method(SERVICE, "Collect", Collect)
        add_health(self.server, ["test.Echo"])
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
    server = Running()
    server.server.max_concurrent_calls = 2
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

class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        out, data = [], bytes(self.written)
        while len(data) >= 9:
            high, low, kind, flags, stream = f.FRAME_HEADER.unpack_from(data)
            length = (high << 8) | low
            out.append((kind, flags, stream, data[9:9 + length]))
            data = data[9 + length:]
        self.written.clear()
        return out


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
    from sidecar.grpcwire.connection import Connection
    server = GrpcServer(max_message_bytes=1 << 20)
    server.add_method(SERVICE, "Send", Sender)
    connection = Connection(server)
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
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
    from sidecar.grpcwire.connection import _consume

    class Owner:
        data = bytearray(b"0123456789")

    owner = Owner()
    view = memoryview(owner.data)  # e.g. held by a logged traceback's frame
    _consume(owner, "data", 4)
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
    assert goaway[0] == f.GOAWAY and struct.unpack(">II", goaway[3])[1] == f.PROTOCOL_ERROR


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
    assert ("grpc-status", "13") in hpack.Decoder().decode(trailers[0])
    assert processor.active_streams == 0
