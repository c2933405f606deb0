"""A real `GrpcServer` on loopback with two test services, for the official grpcio client;
and a connection to one on a fake transport, driven by raw frames."""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import ClassVar

import grpc
import hpack

from sidecar.grpcwire import Call, GrpcServer
from sidecar.grpcwire import frames as f
from sidecar.grpcwire.health import add_health
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


def identity(x: bytes) -> bytes:
    return x


def bidi(channel: grpc.Channel, name: str = "Echo"):
    return channel.stream_stream(f"/{SERVICE}/{name}", request_serializer=identity,
                                 response_deserializer=identity)


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
