"""The connection on a fake transport: flow control, framing across reads, table-size
updates and calls the server ends itself (review findings)."""

from __future__ import annotations

import itertools
import struct

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire import frames as f
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.headers import HeaderDecoder
from tests.conformance.clients import FakeTransport
from tests.unit.grpcwire.servers import (
    SERVICE,
    Sender,
    data_of,
    fake_connection,
    open_call,
)


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
