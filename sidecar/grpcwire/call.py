"""One gRPC call (an HTTP/2 stream) as a method handler sees it, and the handler interface.

Handlers are synchronous: the sidecar's per-request work is pure CPU, so a call needs no
task, no queue and no await. A handler answers from inside `on_message` by calling
`call.send` and `call.finish`; the connection writes everything a read produced at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sidecar.grpcwire.connection import Connection

# gRPC status codes used here (grpc/doc/statuscodes.md).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT = 0, 1, 2, 3
NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 5, 8, 12, 13, 14


class Handler(Protocol):
    """What a method does with one call. Exceptions end the call with INTERNAL."""

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        """`payload` may be a view of the connection's buffer, valid only during the call:
        parse it (or copy it) before returning."""

    def on_half_close(self, call: Call) -> None:
        """The client sent its last message; finish now unless the method streams on."""

    def on_cancel(self) -> None:
        """The call ended before the handler finished it (reset, connection lost, stop)."""


HandlerFactory = Callable[[], Handler]


class Call:
    __slots__ = ("_connection", "finished", "handler", "headers_sent", "id", "inbox",
                 "pending_data", "pending_trailers", "recv_unacked", "remote_closed",
                 "send_window")

    def __init__(self, connection: Connection, stream_id: int, send_window: int) -> None:
        self._connection = connection
        self.id = stream_id
        self.handler: Handler | None = None
        self.inbox = bytearray()
        self.send_window = send_window
        self.recv_unacked = 0
        self.pending_data = bytearray()  # waiting for flow-control window
        self.pending_trailers: bytes | None = None
        self.headers_sent = False
        self.finished = False
        self.remote_closed = False

    def send(self, message: bytes) -> None:
        """Send one response message (serialized protobuf)."""
        if not self.finished:
            self._connection.send_message(self, (message,))

    def send_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send one response message given as pieces, framed without joining them."""
        if not self.finished:
            self._connection.send_message(self, parts)

    def finish(self, status: int = OK, message: str = "") -> None:
        """End the call with a gRPC status; later sends and finishes are ignored."""
        if not self.finished:
            self.finished = True
            self._connection.finish_call(self, status, message)
