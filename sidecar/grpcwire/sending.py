"""What a connection sends: response headers, messages and trailers framed for HTTP/2,
flow control of what we send, and one transport write per socket read."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.call import Call
from sidecar.grpcwire.limits import ServerLimits


class FrameWriter:
    """The sending half of `Connection`. `_calls` is the connection's table of open calls
    (a finished call leaves it once its last bytes are out); `_reading` is set while a
    socket read is being handled, so everything it causes leaves in one write."""

    _limits: ServerLimits

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, Call] = {}
        self._blocked: dict[int, Call] = {}  # calls with output waiting for window
        self._out = bytearray()
        self._reading = False
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_MAX_FRAME
        # The peer shrank its HPACK table: our next header block must say so first.
        self._table_size_update = False
        self._queued_output = 0  # bytes of answers waiting for the peer's windows

    def send_message(self, call: Call, parts: Sequence[bytes | memoryview]) -> None:
        """One gRPC message, whose bytes are `parts` one after another (bytes, or views in
        byte format: lengths are counted in items)."""
        if not call.headers_sent:
            call.headers_sent = True
            self._out += f.frame(f.HEADERS, f.END_HEADERS, call.id,
                                 self._block(f.RESPONSE_HEADERS))
        size = sum(map(len, parts))
        self._send_data(call, (f.MESSAGE_PREFIX.pack(0, size), *parts), 5 + size)
        self._flush_unless_reading()

    def finish_call(self, call: Call, status: int, message: str) -> None:
        if call.reserved:
            self._drop_inbox(call)
        if call.open_method:
            self._open_call_ended(call)
        if call.headers_sent:
            block = f.trailers(status, message)
        else:  # trailers-only response
            call.headers_sent = True
            block = f.RESPONSE_HEADERS + f.trailers(status, message)
        trailers = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, call.id, self._block(block))
        if call.pending_data:
            call.pending_trailers = trailers
        else:
            self._out += trailers
            calls = self._calls  # (_forget, inlined: once per call)
            calls.pop(call.id, None)
            if not calls:
                self._became_idle()
        self._flush_unless_reading()

    def _forget(self, call: Call) -> None:
        """The call leaves the table of open calls."""
        calls = self._calls
        calls.pop(call.id, None)
        if not calls:
            self._became_idle()

    def _drop_inbox(self, call: Call) -> None:
        """Hook: a call with a reserved (unfinished) message is finished."""

    def _became_idle(self) -> None:
        """Hook: the connection has no open call now."""

    def _open_call_ended(self, call: Call) -> None:
        """Hook: an open-method call is finished."""

    def _exhausted(self, call: Call, reason: str) -> None:
        """Hook: end a call with RESOURCE_EXHAUSTED."""

    def _calm(self, reason: str) -> None:
        """Hook: end the connection with GOAWAY ENHANCE_YOUR_CALM."""

    def _block(self, block: bytes) -> bytes:
        """Our blocks never use the peer's table, but after the peer shrinks it the next
        block must acknowledge that with a size update (RFC 7541 §4.2); 0 is always valid."""
        if self._table_size_update:
            self._table_size_update = False
            return f.TABLE_SIZE_ZERO + block
        return block

    def _send_data(self, call: Call, parts: Sequence[bytes | memoryview], size: int) -> None:
        if call.pending_data:
            for part in parts:
                call.pending_data += part
            self._queued(call, size)
            return
        # A window can be negative after the peer lowers SETTINGS_INITIAL_WINDOW_SIZE.
        allowed = max(0, min(size, self._send_window, call.send_window))
        rest = self._write_data(call, parts, allowed) if allowed else 0
        if allowed < size:
            for part in parts[rest:]:
                call.pending_data += part
            # The part the frames stopped in was written up to its first unsent byte.
            if rest < len(parts):
                sent_of_part = allowed - sum(map(len, parts[:rest]))
                del call.pending_data[:sent_of_part]
            self._blocked[call.id] = call
            self._queued(call, size - allowed)

    def _queued(self, call: Call, size: int) -> None:
        """`size` more bytes wait for the peer's windows: a call may queue two of its
        method's largest messages (beyond: it ends, RESOURCE_EXHAUSTED), a connection
        `connection_output_bytes` (beyond: GOAWAY ENHANCE_YOUR_CALM)."""
        self._queued_output += size
        pending = call.pending_data
        if len(pending) > 2 * (call.max_message + 5):
            self._queued_output -= len(pending)
            pending.clear()
            self._blocked.pop(call.id, None)
            self._exhausted(call, "too many answers waiting for the peer's flow-control window")
        elif self._queued_output > self._limits.connection_output_bytes:
            self._calm("too many answers waiting for the peer's flow-control window")

    def _write_data(self, call: Call, parts: Sequence[bytes | memoryview], size: int) -> int:
        """Frame the first `size` bytes of `parts` straight into the output buffer (one
        copy; frames may span parts). Returns the index of the part the frames stopped in
        (len(parts) when all were sent)."""
        self._send_window -= size
        call.send_window -= size
        step = self._peer_max_frame
        out = self._out
        frame_left = 0
        for index, part in enumerate(parts):
            view = memoryview(part)
            offset, length = 0, len(view)
            while offset < length:
                if size == 0:
                    return index
                if frame_left == 0:
                    frame_left = min(step, size)
                    out += f.header(f.DATA, 0, call.id, frame_left)
                taken = min(frame_left, length - offset)
                out += view[offset:offset + taken]
                offset += taken
                frame_left -= taken
                size -= taken
        return len(parts)

    def _drain_blocked(self) -> None:
        for call in list(self._blocked.values()):
            self._drain(call)
            if self._send_window <= 0:
                break

    def _drain(self, call: Call) -> None:
        pending = call.pending_data
        allowed = min(len(pending), self._send_window, call.send_window)
        if allowed <= 0:
            return
        self._write_data(call, (bytes(pending[:allowed]),), allowed)
        del pending[:allowed]
        self._queued_output -= allowed
        if pending:
            return
        self._blocked.pop(call.id, None)
        if call.pending_trailers is not None:
            self._out += call.pending_trailers
            call.pending_trailers = None
            self._forget(call)
        self._flush_unless_reading()

    def _flush_unless_reading(self) -> None:
        if not self._reading:
            self._flush()

    def _flush(self) -> None:
        """Hand the output buffer to the transport as is (no copy) and start a new one."""
        if self._out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(self._out)
            self._out = bytearray()
        else:
            self._out.clear()
