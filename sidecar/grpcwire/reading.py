"""The receiving half of a connection up to the frame: socket reads into HTTP/2 frames, and
every frame but DATA handled to the letter of RFC 9113 (SETTINGS, PING, WINDOW_UPDATE,
RST_STREAM, PRIORITY, GOAWAY, HEADERS and CONTINUATION into whole header blocks).

Its own module because it is where a peer's bytes first meet the server: each violation
raises ProtocolError with its error code, which the connection turns into a GOAWAY. Frames
are parsed straight from each read; only what a read cuts off waits in `_buffer`. DATA
frames go on, as views of the read, to message_splitting.py; whole header blocks to
call_lifecycle.py; what we send back lives in sending.py.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.buffers import consume
from sidecar.grpcwire.frames import ProtocolError
from sidecar.grpcwire.headers import HeaderDecoder
from sidecar.grpcwire.limits import MAX_WINDOW

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.grpcwire.call import Call
    from sidecar.grpcwire.flood import Budget
    from sidecar.grpcwire.limits import ServerLimits

_U32 = struct.Struct(">I")
_PRIORITY_FIELDS = 5  # stream dependency (4) and weight (1)


class FrameReader:
    """Mixin of Connection."""

    # Kept by the rest of Connection.
    _transport: asyncio.Transport | None
    _limits: ServerLimits
    _calls: dict[int, Call]
    _blocked: dict[int, Call]
    _out: bytearray
    _send_window: int
    _peer_initial_window: int
    _peer_max_frame: int
    _table_size_update: bool
    _queued_output: int
    _ping_budget: Budget
    _settings_budget: Budget
    _reset_budget: Budget
    _empty_budget: Budget
    _spend: Callable[[Budget, str], None]

    def _init_reading(self, limits: ServerLimits) -> None:
        self._buffer = bytearray()
        self._preface_seen = False
        self._settings_seen = False
        self._headers = HeaderDecoder()
        self._continuation: tuple[int, int, bytearray] | None = None
        self._last_stream_id = 0
        self._max_frame = limits.max_frame_bytes

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
            if not f.PREFACE.startswith(buffer):
                raise ProtocolError(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
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
        if length > self._max_frame:
            raise ProtocolError(f.FRAME_SIZE_ERROR, f"frame of {length} bytes")
        taken = min(9 + length - len(buffer), len(data))
        buffer += data[:taken]
        if len(buffer) < 9 + length:
            return None
        with memoryview(buffer) as view:
            self._frames(view)
        consume(self, "_buffer", len(buffer))
        return data[taken:]

    def _frames(self, view: memoryview) -> int:
        """Handle every whole frame at the start of `view`; return the bytes used. (Payload
        slices are passed as temporaries, so none outlives the call it was made for.)"""
        position, size = 0, len(view)
        max_frame = self._max_frame
        while size - position >= 9:
            high, low, kind, flags, stream_id = f.FRAME_HEADER.unpack_from(view, position)
            length = (high << 8) | low
            if length > max_frame:
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
        if not self._settings_seen:
            if kind != f.SETTINGS or flags & f.ACK:
                raise ProtocolError(f.PROTOCOL_ERROR, "the connection must begin with SETTINGS")
            self._settings_seen = True
            self._handshake_done()
        if kind == f.HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == f.DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == f.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == f.SETTINGS:
            if stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "SETTINGS on a stream")
            self._spend(self._settings_budget, "SETTINGS frames")
            if not flags & f.ACK:
                self._on_settings(payload)
            elif payload:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == f.PING:
            if stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "PING length")
            self._spend(self._ping_budget, "PING frames")
            if not flags & f.ACK:
                self._out += f.frame(f.PING, f.ACK, 0, payload)
        elif kind == f.RST_STREAM:
            self._on_reset(stream_id, payload)
        elif kind == f.PRIORITY:
            if not stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != _PRIORITY_FIELDS:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "PRIORITY length")
            _check_dependency(stream_id, payload)
        elif kind == f.GOAWAY:
            if stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "GOAWAY length")
            # the peer opens no more calls; those open may finish
        elif kind == f.PUSH_PROMISE:
            raise ProtocolError(f.PROTOCOL_ERROR, "clients cannot push")
        # Frames of unknown types are ignored (RFC 9113 §5.5).

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & f.PADDED:
            if not payload:
                raise ProtocolError(f.PROTOCOL_ERROR, "bad HEADERS padding")
            start, end = 1, end - payload[0]
        if flags & f.PRIORITY_FLAG:
            if end - start >= _PRIORITY_FIELDS:
                _check_dependency(stream_id, payload[start:start + _PRIORITY_FIELDS])
            start += _PRIORITY_FIELDS
        if start > end:
            raise ProtocolError(f.PROTOCOL_ERROR, "bad HEADERS padding")
        block = payload[start:end]
        if not block:
            self._spend(self._empty_budget, "empty frames")
        if len(block) > self._limits.max_header_block_bytes:
            raise ProtocolError(f.PROTOCOL_ERROR, "header block too large")
        if flags & f.END_HEADERS:
            self._header_block(flags, stream_id, block)
        else:
            self._continuation = (stream_id, flags, bytearray(block))

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
        if not payload:
            self._spend(self._empty_budget, "empty frames")
        self._continuation[2].extend(payload)
        if len(self._continuation[2]) > self._limits.max_header_block_bytes:
            raise ProtocolError(f.PROTOCOL_ERROR, "header block too large")
        if flags & f.END_HEADERS:
            _, first_flags, block = self._continuation
            self._continuation = None
            self._header_block(first_flags, stream_id, bytes(block))

    def _on_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "SETTINGS length")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for call in self._calls.values():
                    call.send_window += delta
                    if call.send_window > MAX_WINDOW:  # RFC 9113 §6.9.2
                        raise ProtocolError(f.FLOW_CONTROL_ERROR, "a stream window overflowed")
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ProtocolError(f.PROTOCOL_ERROR, "invalid SETTINGS_MAX_FRAME_SIZE")
                self._peer_max_frame = value
            elif key == f.SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise ProtocolError(f.PROTOCOL_ERROR, "invalid SETTINGS_ENABLE_PUSH")
            elif key == f.SETTINGS_HEADER_TABLE_SIZE and value < f.DEFAULT_TABLE_SIZE:
                self._table_size_update = True
        self._out += f.frame(f.SETTINGS, f.ACK, 0)
        self._drain_blocked()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not increment:
            raise ProtocolError(f.PROTOCOL_ERROR, "WINDOW_UPDATE with a zero increment")
        if stream_id == 0:
            window = self._send_window + increment
            if window > MAX_WINDOW:
                raise ProtocolError(f.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self._send_window = window
            self._drain_blocked()
            return
        call = self._calls.get(stream_id)
        if call is None:
            if stream_id > self._last_stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        window = call.send_window + increment
        if window > MAX_WINDOW:
            raise ProtocolError(f.FLOW_CONTROL_ERROR, "stream window past 2^31-1")
        call.send_window = window
        if call.id in self._blocked:
            self._drain(call)

    def _on_reset(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(f.FRAME_SIZE_ERROR, "RST_STREAM length")
        if not stream_id:
            raise ProtocolError(f.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        call = self._calls.get(stream_id)
        if call is None:
            if stream_id > self._last_stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            # A call already over: Envoy resets each finished ext_proc stream, so on an
            # authenticated connection these are normal traffic and never charged.
            if not self._authenticated:
                self._spend(self._reset_budget, "RST_STREAM frames")
            return
        if call.open_method:  # (authenticated calls are never charged)
            self._spend(self._reset_budget, "RST_STREAM frames")
        self._blocked.pop(stream_id, None)
        if call.pending_data:
            self._queued_output -= len(call.pending_data)
            call.pending_data.clear()
        self._forget(call)
        self._cancel(call)


def _check_dependency(stream_id: int, fields: bytes) -> None:
    if _U32.unpack_from(fields)[0] & 0x7FFFFFFF == stream_id:
        raise ProtocolError(f.PROTOCOL_ERROR, "a stream cannot depend on itself")
