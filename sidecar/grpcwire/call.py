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
UNAUTHENTICATED = 16


class UndecodableMessage(Exception):
    """Raised by a handler whose message cannot be decoded (protobuf's DecodeError is taken
    the same way): the call ends with INVALID_ARGUMENT and one rate-limited WARNING line, no
    traceback. It is the peer's fault, not a bug here."""


class Handler(Protocol):
    """What a method does with one call. Exceptions end the call with INTERNAL (and a
    rate-limited traceback); UndecodableMessage with INVALID_ARGUMENT."""

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        """`payload` may be a view of the connection's buffer, valid only during the call:
        parse it (or copy it) before returning."""

    def on_half_close(self, call: Call) -> None:
        """The client sent its last message; finish now unless the method streams on."""

    def on_cancel(self) -> None:
        """The call ended before the handler finished it (reset, connection lost, stop)."""


HandlerFactory = Callable[[], Handler]


class Call:
    __slots__ = ("_connection", "credit_due", "deadline", "expected", "finished", "handler",
                 "headers_sent", "id", "inbox", "max_message", "method", "open_method",
                 "pending_data", "pending_trailers", "recv_window", "remote_closed", "reserved",
                 "send_window")

    def __init__(self, connection: Connection, stream_id: int, send_window: int,
                 recv_window: int, method: bytes = b"", max_message: int = 0) -> None:
        self._connection = connection
        self.id = stream_id
        self.method = method
        self.max_message = max_message
        self.handler: Handler | None = None
        # The bytes of an unfinished message (at most one per call: messages on a stream
        # come one after another), and what is reserved for it: its whole framed size once
        # its prefix is in, of which `expected` bytes have not arrived yet.
        self.inbox = bytearray()
        self.reserved = 0
        self.expected = 0
        self.send_window = send_window
        # Receive flow control: the credit the peer has on this stream, and credit earned
        # (bytes consumed, or a reservation made) but not yet sent in a WINDOW_UPDATE.
        self.recv_window = recv_window
        self.credit_due = 0
        self.pending_data = bytearray()  # waiting for flow-control window
        self.pending_trailers: bytes | None = None
        self.headers_sent = False
        self.finished = False
        self.remote_closed = False
        # A call of a method open without the channel token (health): its own budget, one
        # request message, and a deadline for it (call_lifecycle.py).
        self.open_method = False
        self.deadline: object | None = None

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

    def defer(self) -> None:
        """The handler will answer later, from a task (strategy: external). Here sends are
        written whenever they are made, so nothing changes."""
