"""The DATA path: a DATA frame's flow-control accounting, and splitting each call's byte
stream into gRPC messages (5-byte length prefix) for its handler.

Its own module because it is the hot path: every message of every call goes through these
three methods, once per frame and once per message, so they are kept flat. The per-frame
accounting of receive_credit.py (window checks, what a frame covers and earns, the stream
credit batch, the fast path of `_earn`) is inlined here rather than called; the rules are
that module's. A message that arrives whole in one frame is handed over as a view of the
frame, never copied; only a message cut across frames waits in its call's inbox, reserved
whole once its prefix is in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.buffers import consume
from sidecar.grpcwire.call import UNIMPLEMENTED
from sidecar.grpcwire.frames import ProtocolError

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.grpcwire.call import Call
    from sidecar.grpcwire.flood import Budget


class MessageSplitter:
    """Mixin of Connection."""

    # Kept by the rest of Connection.
    _calls: dict[int, Call]
    _out: bytearray
    _last_stream_id: int
    _recv_window: int
    _credit_due: int
    _credit_batch: int
    _stream_credit_batch: int
    _empty_budget: Budget
    _spend: Callable[[Budget, str], None]

    def _on_data(self, flags: int, stream_id: int, payload: memoryview | bytes) -> None:
        """The hot path. Credit for what a frame brings is earned back when its bytes are
        consumed (a whole message dispatched, or bytes discarded); bytes of a message that
        was reserved were granted when it was reserved ("covered") and earn nothing."""
        length = len(payload)
        window = self._recv_window - length
        if window < 0:
            raise ProtocolError(f.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window = window
        call = self._calls.get(stream_id)
        if call is None:
            if not stream_id or stream_id > self._last_stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "DATA on an idle stream")
            if not length and not flags & f.END_STREAM:
                self._spend(self._empty_budget, "empty frames")
            self._earn(length)  # a call that is over: discarded
            return
        if call.remote_closed:
            raise ProtocolError(f.STREAM_CLOSED, "DATA after END_STREAM")
        window = call.recv_window - length
        if window < 0:
            raise ProtocolError(f.FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        call.recv_window = window
        if call.finished:  # its trailers are still queued: discarded
            if not length and not flags & f.END_STREAM:
                self._spend(self._empty_budget, "empty frames")
            call.remote_closed = bool(flags & f.END_STREAM)
            self._earn(length)
            return
        if flags & f.PADDED:
            payload = _unpad(payload)
        covered = call.expected
        if covered:
            if covered > len(payload):
                covered = len(payload)
            call.expected -= covered
        if payload:
            self._messages(call, payload)
        elif not flags & f.END_STREAM:  # (never taken by a frame that carries bytes)
            self._spend(self._empty_budget, "empty frames")
        # (A frame that earns nothing, the bulk of a large message, is done here; a
        # reservation made above always comes with bytes that earn.)
        earned = length - covered
        if earned:
            due = self._credit_due + earned  # (_earn, inlined)
            if due < self._credit_batch:
                self._credit_due = due
            else:
                self._earn(earned)
        if flags & f.END_STREAM:
            call.remote_closed = True
            if not call.finished:
                if call.inbox:
                    self._incomplete(call)
                else:
                    self._dispatch(call, None)
        elif earned and not call.finished:
            due = call.credit_due + earned
            if due >= self._stream_credit_batch:
                self._out += f.window_update(stream_id, due)
                call.recv_window += due
                due = 0
            call.credit_due = due

    def _messages(self, call: Call, payload: memoryview | bytes) -> None:
        """Split gRPC length-prefixed messages out of the call's byte stream. Messages that
        arrive whole in one frame are taken straight from it; the rest wait in the inbox,
        reserved whole once their prefix is in."""
        inbox = call.inbox
        if not inbox:
            used = self._whole_messages(call, payload)
            if used < len(payload) and not call.finished:
                call.inbox += payload[used:]
                self._reserve(call)
            return
        inbox += payload
        reserved = call.reserved
        if reserved:
            if len(inbox) < reserved:
                return  # the reserved message is still incomplete
            self._release(call)  # it is complete: it goes out next
        with memoryview(inbox) as data:
            used = self._whole_messages(call, data)
        consume(call, "inbox", used)
        if call.inbox and not call.reserved:
            if call.finished:
                consume(call, "inbox", len(call.inbox))
            else:
                self._reserve(call)

    def _whole_messages(self, call: Call, data: memoryview | bytes) -> int:
        """Dispatch every complete message at the start of `data`; return the bytes used."""
        used, available = 0, len(data)
        limit = call.max_message
        while available - used >= 5 and not call.finished:
            compressed, size = f.MESSAGE_PREFIX.unpack_from(data, used)
            if size > limit:
                self._exhausted(call, f"message larger than {limit} bytes")
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


def _unpad(payload: bytes | memoryview) -> bytes | memoryview:
    if not payload:
        raise ProtocolError(f.PROTOCOL_ERROR, "bad DATA padding")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError(f.PROTOCOL_ERROR, "bad DATA padding")
    return payload[1:len(payload) - pad]
