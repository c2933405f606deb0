"""The server side of one HTTP/2 connection carrying gRPC calls, as an asyncio protocol.

Why not grpc.aio: Envoy opens one ext_proc stream per HTTP request, and grpc.aio spends
most of the sidecar's CPU on per-stream machinery (a task per call, completion-queue hops,
several awaits per message). Here a read is parsed in place, each complete message goes
straight to its method's synchronous handler, and everything the read produced leaves in one
write. Measured in bench/side_by_side.py; see docs/performance.md.

Scope: plaintext HTTP/2 (h2c with prior knowledge) as gRPC clients and Envoy speak it, flow
control in both directions, PING, SETTINGS, RST_STREAM, GOAWAY, CONTINUATION, padding.
Header blocks are decoded in headers.py; what we send is framed and flow-controlled in
sending.py.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, cast

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.call import INTERNAL, RESOURCE_EXHAUSTED, UNIMPLEMENTED, Call
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.headers import HeaderDecoder
from sidecar.grpcwire.sending import FrameWriter

if TYPE_CHECKING:
    from sidecar.grpcwire.server import GrpcServer

log = logging.getLogger("sidecar.grpcwire")

# What we let the peer send before it hears from us again. Generous, so a buffered 1 MiB
# body flows without waiting for window updates; replenished at half.
STREAM_WINDOW = 16 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME_IN = 256 * 1024
# The largest request header block we accept (gRPC clients send a few hundred bytes).
MAX_HEADER_BLOCK = 64 * 1024
_U32 = struct.Struct(">I")


class Connection(FrameWriter, asyncio.Protocol):
    def __init__(self, server: GrpcServer) -> None:
        super().__init__()
        self._server = server
        self._buffer = bytearray()
        self._preface_seen = False
        self._headers = HeaderDecoder()
        self._recv_unacked = 0
        self._continuation: tuple[int, int, bytearray] | None = None
        self._last_stream_id = 0
        self.going_away = False

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._server.connections.add(self)
        self._out += f.settings({
            f.SETTINGS_ENABLE_PUSH: 0,
            f.SETTINGS_MAX_CONCURRENT_STREAMS: self._server.max_concurrent_calls,
            f.SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            f.SETTINGS_MAX_FRAME_SIZE: MAX_FRAME_IN,
            f.SETTINGS_MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK,
        })
        self._out += f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW)
        self._flush()

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            self._receive(data)
        except ProtocolError as error:
            log.warning("closing gRPC connection: %s", error)
            self._out += f.goaway(self._last_stream_id, error.code)
            self._close()
        except Exception:
            log.exception("closing gRPC connection after an internal error")
            self._out += f.goaway(self._last_stream_id, f.INTERNAL_ERROR)
            self._close()
        finally:
            self._reading = False
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        calls, self._calls = self._calls, {}
        self._blocked.clear()
        for call in calls.values():
            self._cancel(call)
        self._transport = None

    def pause_writing(self) -> None:  # the peer is not reading: stop reading from it
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    # --- used by the server -----------------------------------------------------------

    def go_away(self) -> None:
        """Graceful stop: no new calls; those in flight may finish."""
        if not self.going_away and self._transport is not None:
            self.going_away = True
            self._out += f.goaway(self._last_stream_id, f.NO_ERROR)
            self._flush()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # --- reading ----------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        """Frames are parsed straight from each read (DATA payloads go on as views of it, so
        a 1 MiB body is copied once, into its call's inbox). Only what a read cuts off, the
        preface or the start of one frame, waits in `_buffer` for the bytes that complete
        it, which are taken from the next read alone."""
        rest: memoryview | None = memoryview(data)
        if not self._preface_seen:
            rest = self._take_preface(rest)
        if rest is not None and self._buffer:
            rest = self._complete_frame(rest)
        if rest is None or self._transport is None or self._transport.is_closing():
            return
        used = self._frames(rest)
        if used < len(rest) and self._transport is not None and not self._transport.is_closing():
            self._buffer += rest[used:]

    def _take_preface(self, data: memoryview) -> memoryview | None:
        buffer = self._buffer
        taken = min(len(f.PREFACE) - len(buffer), len(data))
        buffer += data[:taken]
        if len(buffer) < len(f.PREFACE):
            return None
        if buffer != f.PREFACE:
            raise ProtocolError(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        self._preface_seen = True
        buffer.clear()
        return data[taken:]

    def _complete_frame(self, data: memoryview) -> memoryview | None:
        """Fill the frame begun in `_buffer` from `data`; handle it once whole. Returns what
        is left of `data`, or None while the frame is still incomplete."""
        buffer = self._buffer
        if len(buffer) < 9:
            taken = min(9 - len(buffer), len(data))
            buffer += data[:taken]
            data = data[taken:]
            if len(buffer) < 9:
                return None
        length = int.from_bytes(buffer[:3], "big")
        if length > MAX_FRAME_IN:
            raise ProtocolError(f.FRAME_SIZE_ERROR, f"frame of {length} bytes")
        taken = min(9 + length - len(buffer), len(data))
        buffer += data[:taken]
        if len(buffer) < 9 + length:
            return None
        with memoryview(buffer) as view:
            self._frames(view)
        _consume(self, "_buffer", len(buffer))
        return data[taken:]

    def _frames(self, view: memoryview) -> int:
        """Handle every whole frame at the start of `view`; return the bytes used. (Payload
        slices are passed as temporaries, so none outlives the call it was made for.)"""
        position, size = 0, len(view)
        while size - position >= 9:
            high, low, kind, flags, stream_id = f.FRAME_HEADER.unpack_from(view, position)
            length = (high << 8) | low
            if length > MAX_FRAME_IN:
                raise ProtocolError(f.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            start, end = position + 9, position + 9 + length
            if end > size:
                break
            position = end
            if kind == f.DATA and self._continuation is None:
                self._on_data(flags, stream_id & 0x7FFFFFFF, view[start:end])
            else:
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(view[start:end]))
            if self._transport is None or self._transport.is_closing():
                break
        return position

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != f.CONTINUATION:
            raise ProtocolError(f.PROTOCOL_ERROR, "header block interrupted")
        if kind == f.DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == f.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == f.SETTINGS:
            if not flags & f.ACK:
                self._on_settings(payload)
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == f.PING:
            if not flags & f.ACK:
                self._out += f.frame(f.PING, f.ACK, 0, payload)
        elif kind == f.RST_STREAM:
            call = self._calls.pop(stream_id, None)
            if call is not None:
                self._blocked.pop(stream_id, None)
                self._cancel(call)
        elif kind == f.PUSH_PROMISE:
            raise ProtocolError(f.PROTOCOL_ERROR, "clients cannot push")
        # PRIORITY, GOAWAY (the peer stops opening calls) and unknown types: nothing to do.

    def _on_data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        length = len(payload)
        self._recv_unacked += length
        if self._recv_unacked >= CONNECTION_WINDOW // 2:
            self._out += f.window_update(0, self._recv_unacked)
            self._recv_unacked = 0
        call = self._calls.get(stream_id)
        if call is None or call.remote_closed or call.finished:
            return  # a call that is over (its trailers may still be queued); bytes counted
        if flags & f.PADDED:
            payload = _unpad(payload)
        call.recv_unacked += length
        if call.recv_unacked >= STREAM_WINDOW // 2 and not flags & f.END_STREAM:
            self._out += f.window_update(stream_id, call.recv_unacked)
            call.recv_unacked = 0
        if payload:
            self._messages(call, payload)
        if flags & f.END_STREAM and not call.finished:
            call.remote_closed = True
            self._dispatch(call, None)

    def _messages(self, call: Call, payload: memoryview) -> None:
        """Split gRPC length-prefixed messages out of the call's byte stream. Messages that
        arrive whole in one frame are taken straight from it; the rest wait in the inbox."""
        inbox = call.inbox
        if not inbox:
            used = self._whole_messages(call, payload)
            if used < len(payload) and not call.finished:
                inbox += payload[used:]
            return
        inbox += payload
        with memoryview(inbox) as data:
            used = self._whole_messages(call, data)
        _consume(call, "inbox", used)

    def _whole_messages(self, call: Call, data: memoryview) -> int:
        """Dispatch every complete message at the start of `data`; return the bytes used."""
        used, available = 0, len(data)
        limit = self._server.max_message_bytes
        while available - used >= 5 and not call.finished:
            compressed, size = f.MESSAGE_PREFIX.unpack_from(data, used)
            if size > limit:
                self._end(call, RESOURCE_EXHAUSTED, f"message larger than {limit} bytes")
            elif compressed:
                self._end(call, UNIMPLEMENTED, "compressed messages are not supported")
            elif available - used - 5 >= size:
                # A view, not a copy: handlers parse the message before they return.
                message = data[used + 5:used + 5 + size]
                used += 5 + size
                self._dispatch(call, message)
                continue
            break
        return used

    def _dispatch(self, call: Call, message: bytes | memoryview | None) -> None:
        """Hand a message (or the client's half-close, None) to the call's handler."""
        handler = call.handler
        if handler is None:
            return
        try:
            if message is None:
                handler.on_half_close(call)
            else:
                handler.on_message(call, message)
        except Exception:
            log.exception("gRPC handler failed")
            self._end(call, INTERNAL, "internal error")

    def _end(self, call: Call, status: int, message: str) -> None:
        """End a call on the server's own account; its handler hears of it as a cancel."""
        if not call.finished:
            call.finish(status, message)
            _tell_cancelled(call)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        start, end = 0, len(payload)
        if flags & f.PADDED:
            if not payload:
                raise ProtocolError(f.PROTOCOL_ERROR, "bad HEADERS padding")
            start, end = 1, end - payload[0]
        if flags & f.PRIORITY_FLAG:
            start += 5
        if start > end:
            raise ProtocolError(f.PROTOCOL_ERROR, "bad HEADERS padding")
        block = payload[start:end]
        if len(block) > MAX_HEADER_BLOCK:
            raise ProtocolError(f.PROTOCOL_ERROR, "header block too large")
        if flags & f.END_HEADERS:
            self._header_block(flags, stream_id, block)
        else:
            self._continuation = (stream_id, flags, bytearray(block))

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
        self._continuation[2].extend(payload)
        if len(self._continuation[2]) > MAX_HEADER_BLOCK:
            raise ProtocolError(f.PROTOCOL_ERROR, "header block too large")
        if flags & f.END_HEADERS:
            _, first_flags, block = self._continuation
            self._continuation = None
            self._header_block(first_flags, stream_id, bytes(block))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        headers = self._headers.decode(block)
        call = self._calls.get(stream_id)
        if call is not None:  # client trailers: gRPC clients send none, but allow them
            if flags & f.END_STREAM and not call.finished:
                call.remote_closed = True
                self._dispatch(call, None)
            return
        if stream_id % 2 == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "even stream id from a client")
        if stream_id <= self._last_stream_id:
            return  # trailers of a call we already finished
        self._last_stream_id = stream_id
        if self.going_away or len(self._calls) >= self._server.max_concurrent_calls:
            self._out += f.rst_stream(stream_id, f.REFUSED_STREAM)
            return
        path = next((value for name, value in headers if name == b":path"), b"")
        call = Call(self, stream_id, self._peer_initial_window)
        self._calls[stream_id] = call
        factory = self._server.methods.get(path)
        if factory is None:
            call.finish(UNIMPLEMENTED, f"unknown method {path[:200].decode('latin-1')}")
            return
        try:
            call.handler = factory()
        except Exception:
            log.exception("gRPC handler could not start")
            call.finish(INTERNAL, "internal error")
            return
        if flags & f.END_STREAM:
            call.remote_closed = True
            self._dispatch(call, None)

    def _on_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "SETTINGS length")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ProtocolError(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for call in self._calls.values():
                    call.send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ProtocolError(f.PROTOCOL_ERROR, "invalid SETTINGS_MAX_FRAME_SIZE")
                self._peer_max_frame = value
            elif key == f.SETTINGS_HEADER_TABLE_SIZE and value < f.DEFAULT_TABLE_SIZE:
                self._table_size_update = True
        self._out += f.frame(f.SETTINGS, f.ACK, 0)
        self._drain_blocked()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self._send_window += increment
            self._drain_blocked()
            return
        call = self._calls.get(stream_id)
        if call is not None:
            call.send_window += increment
            if call.id in self._blocked:
                self._drain(call)

    def _cancel(self, call: Call) -> None:
        """The peer ended the call (reset, or the connection is gone)."""
        if not call.finished:
            call.finished = True
            _tell_cancelled(call)

    def _close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()


def _tell_cancelled(call: Call) -> None:
    if call.handler is not None:
        try:
            call.handler.on_cancel()
        except Exception:
            log.exception("gRPC handler failed on cancel")


def _consume(owner: object, name: str, used: int) -> None:
    """Drop the first `used` bytes of the bytearray `owner.<name>`. If a view of it is still
    alive somewhere (a traceback kept by a log handler holds the frames that had one), the
    bytearray cannot shrink in place, so the rest moves to a new one instead."""
    if not used:
        return
    data: bytearray = getattr(owner, name)
    try:
        del data[:used]
    except BufferError:
        setattr(owner, name, bytearray(memoryview(data)[used:]))


def _unpad(payload: bytes | memoryview) -> bytes | memoryview:
    if not payload:
        raise ProtocolError(f.PROTOCOL_ERROR, "bad DATA padding")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError(f.PROTOCOL_ERROR, "bad DATA padding")
    return payload[1:len(payload) - pad]
