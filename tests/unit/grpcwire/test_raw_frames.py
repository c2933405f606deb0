"""Protocol corner cases of the gRPC server, sent as raw HTTP/2 frames."""

from __future__ import annotations

import socket
import struct
import time

import grpc
import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.headers import HeaderDecoder
from tests.unit.grpcwire.servers import (
    SERVICE,
    Running,
    bidi,
)


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
