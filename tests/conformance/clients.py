"""The peers the conformance tests drive the gRPC port with, one per way of reaching it:

- a raw-frame client (`RawClient`): HTTP/2 by hand, any frames in any order, for protocol
  violations and timing (plus helpers that build and read frames);
- an `h2` client (`H2Client`): an independent HTTP/2 implementation that obeys flow
  control, for well-behaved gRPC calls and the memory attacks;
- a connection on a fake transport (`fake_connection`): no socket, no loop, for the fuzz
  tests that need `data_received` in the test's own thread.

Apart from conftest.py, which keeps the server side (test handlers, the server thread and
its fixture), so a test module imports what it talks with from here.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import hpack

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire import frames as f

# --- raw frames ------------------------------------------------------------------------------

Frame = tuple[int, int, int, bytes]  # type, flags, stream id, payload


def grpc_message(payload: bytes, declared: int | None = None) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload) if declared is None else declared) + payload


def request_headers(path: str, metadata: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers"), *metadata]


def open_frame(stream_id: int, path: str, end_stream: bool = False) -> bytes:
    """A HEADERS frame opening a call; its block stands alone only as the connection's
    first (the encoder's dynamic table is fresh)."""
    flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
    return f.frame(f.HEADERS, flags, stream_id, hpack.Encoder().encode(request_headers(path)))


class RawClient:
    """HTTP/2 by hand: whatever frames the test wants, in whatever order."""

    def __init__(self, port: int, handshake: bool = True,
                 settings: dict[int, int] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._buffer = b""
        self.eof = False
        if handshake:
            self.send(f.PREFACE + f.settings(settings or {}))

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, *chunks: bytes) -> None:
        self.sock.sendall(b"".join(chunks))

    def headers(self, stream_id: int, path: str, end_stream: bool = False,
                metadata: Iterable[tuple[str, str]] = ()) -> bytes:
        block = self.encoder.encode(request_headers(path, metadata))
        flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
        return f.frame(f.HEADERS, flags, stream_id, block)

    def read(self, until: Callable[[Frame], bool] | None = None,
             timeout: float = 10) -> list[Frame]:
        """Frames until one satisfies `until` (or, without it, until the server closes)."""
        frames: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            while len(self._buffer) >= 9:
                high, low, kind, flags, stream = f.FRAME_HEADER.unpack_from(self._buffer)
                length = (high << 8) | low
                if len(self._buffer) < 9 + length:
                    break
                frame = (kind, flags, stream & 0x7FFFFFFF, self._buffer[9:9 + length])
                self._buffer = self._buffer[9 + length:]
                frames.append(frame)
                if until is not None and until(frame):
                    return frames
            left = deadline - time.monotonic()
            if self.eof or left <= 0:
                return frames
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                return frames
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.eof = True
            self._buffer += chunk

    def read_until_closed(self, timeout: float = 10) -> list[Frame]:
        frames = self.read(None, timeout)
        assert self.eof, "the server did not close the connection"
        return frames

    def ping(self, timeout: float = 10) -> bool:
        """True when the server answers a PING (the connection is still served)."""
        try:
            self.send(f.frame(f.PING, 0, 0, b"pingpong"))
        except OSError:
            return False
        frames = self.read(lambda fr: fr[0] == f.PING and fr[1] & f.ACK, timeout)
        return any(fr[0] == f.PING and fr[1] & f.ACK for fr in frames)

    def trailers(self, frames: list[Frame], stream_id: int) -> dict[str, str]:
        """Decode every header block of `frames` in order (the HPACK table follows them);
        return the fields of the one that ended `stream_id`."""
        found: dict[str, str] = {}
        for kind, flags, stream, payload in frames:
            if kind == f.HEADERS:
                fields = dict(self.decoder.decode(payload))
                if stream == stream_id and flags & f.END_STREAM:
                    found = fields
        return found


def ends_stream(stream_id: int) -> Callable[[Frame], bool]:
    return lambda fr: fr[0] == f.HEADERS and fr[2] == stream_id and bool(fr[1] & f.END_STREAM)


def is_goaway(frame: Frame) -> bool:
    return frame[0] == f.GOAWAY


def goaway_code(frames: list[Frame]) -> int | None:
    codes = [struct.unpack(">II", p[:8])[1] for kind, _, _, p in frames if kind == f.GOAWAY]
    return codes[-1] if codes else None


# --- the h2 client -----------------------------------------------------------------------------

@dataclass
class Reply:
    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None
    ended: bool = False

    @property
    def status(self) -> str | None:
        return self.trailers.get("grpc-status", self.headers.get("grpc-status"))

    def messages(self) -> list[bytes]:
        out, data = [], bytes(self.data)
        while len(data) >= 5:
            size = struct.unpack(">I", data[1:5])[0]
            out.append(data[5:5 + size])
            data = data[5 + size:]
        return out


class H2Client:
    """A gRPC client made of the `h2` library over a plain socket; obeys flow control."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.replies: dict[int, Reply] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self._flush()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def open(self, path: str, metadata: Iterable[tuple[str, str]] = (),
             end_stream: bool = False) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.replies[stream_id] = Reply()
        self.conn.send_headers(stream_id, request_headers(path, metadata), end_stream=end_stream)
        self._flush()
        return stream_id

    def pump(self, timeout: float = 10) -> bool:
        """Read once (up to `timeout`) and handle the events. False when nothing came."""
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            return False
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        for event in self.conn.receive_data(chunk):
            self._event(event)
        self._flush()
        return True

    def _event(self, event: h2.events.Event) -> None:
        reply = self.replies.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and reply is not None:
            reply.headers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived) and reply is not None:
            reply.data += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived) and reply is not None:
            reply.trailers = dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded) and reply is not None:
            reply.ended = True
        elif isinstance(event, h2.events.StreamReset) and reply is not None:
            reply.reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event

    def send(self, stream_id: int, data: bytes, end_stream: bool = False,
             timeout: float = 20) -> int:
        """Send `data` as the window allows, waiting for credit; returns the bytes sent
        (less than all when the stream was reset or no credit came within `timeout`)."""
        view, sent = memoryview(data), 0
        deadline = time.monotonic() + timeout
        while sent < len(view):
            reply = self.replies[stream_id]
            if reply.reset is not None or reply.ended or self.closed:
                return sent
            window = min(self.conn.local_flow_control_window(stream_id),
                         self.conn.max_outbound_frame_size, len(view) - sent)
            if window <= 0:
                left = deadline - time.monotonic()
                if left <= 0 or (not self.pump(left) and self.closed):
                    return sent
                continue
            last = sent + window == len(view)
            self.conn.send_data(stream_id, view[sent:sent + window].tobytes(),
                                end_stream=end_stream and last)
            sent += window
            self._flush()
        if not data and end_stream:
            self.conn.end_stream(stream_id)
            self._flush()
        return sent

    def wait(self, stream_id: int, timeout: float = 20) -> Reply:
        deadline = time.monotonic() + timeout
        reply = self.replies[stream_id]
        while not (reply.ended or reply.reset is not None or self.closed):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.pump(left)
        return reply

    def unary(self, path: str, message: bytes, metadata: Iterable[tuple[str, str]] = ()) -> Reply:
        stream_id = self.open(path, metadata)
        self.send(stream_id, grpc_message(message), end_stream=True)
        return self.wait(stream_id)


# --- a connection on a fake transport (no socket, no loop) -------------------------------------

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

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def frames(self) -> list[Frame]:
        out, data = [], bytes(self.written)
        while len(data) >= 9:
            high, low, kind, flags, stream = f.FRAME_HEADER.unpack_from(data)
            length = (high << 8) | low
            out.append((kind, flags, stream, data[9:9 + length]))
            data = data[9 + length:]
        self.written.clear()
        return out


def fake_connection(server: GrpcServer, handshake: bool = True):
    from sidecar.grpcwire.connection import Connection
    connection, transport = Connection(server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    if handshake:
        connection.data_received(f.PREFACE + f.settings({}))
        transport.frames()
    return connection, transport


def status_of(frames: list[Frame], stream_id: int, decoder: hpack.Decoder | None = None) -> str:
    decoder = decoder or hpack.Decoder()
    status = ""
    for kind, flags, stream, payload in frames:
        if kind == f.HEADERS:
            fields = dict(decoder.decode(payload))
            if stream == stream_id and flags & f.END_STREAM:
                status = fields.get("grpc-status", "")
    return status


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTimer:
    def __init__(self, when: float, callback, args) -> None:
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """`call_later` and `time` on a clock advanced by hand (`advance_to` runs what is due)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.clock.now

    def call_later(self, delay: float, callback, *args) -> FakeTimer:
        timer = FakeTimer(self.clock.now + delay, callback, args)
        self.timers.append(timer)
        return timer

    def advance_to(self, when: float) -> None:
        while True:
            due = [t for t in self.timers if not t.cancelled and t.when <= when]
            if not due:
                break
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.clock.now = timer.when
            timer.callback(*timer.args)
        self.clock.now = when


class AbortableTransport(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = self.closed = True
