"""Receive-side flow control and the memory reserved for unfinished messages: how much a
peer may send us (the windows we granted) and how much of what it sent we hold.

Its own module because these two ledgers must agree with each other and with the peer, and
that is the part of the port a hostile peer aims at (docs/grpc-server.md, "Memory for
unfinished messages"). The rules:

- Credit is earned back as bytes are *consumed* (a whole message handed to its handler, or
  bytes discarded) and sent once half a window is due; never merely because bytes arrived.
- A message cut across reads is *reserved* whole, at its declared size, against the
  connection's and the server's caps once its 5-byte prefix is in, and the peer is granted
  the credit for the rest of it at once (`expected`: still to come, "covered", earning
  nothing), so it can always be finished; if it does not fit, its call ends
  (RESOURCE_EXHAUSTED) instead of stalling every call behind it.
- Credit granted for a reserved message that then never comes is paid back from what later
  bytes earn (`_credit_due` may go negative).

The per-frame part (window checks, what a DATA frame covers and earns) runs for every DATA
frame, so it is inlined in `MessageSplitter._on_data` (message_splitting.py); this module
holds the state, the slower paths and the reservations.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.buffers import consume
from sidecar.grpcwire.call import INVALID_ARGUMENT
from sidecar.grpcwire.limits import MAX_WINDOW

if TYPE_CHECKING:
    from collections.abc import Callable

    from sidecar.grpcwire.call import Call
    from sidecar.grpcwire.counters import ServerCounters
    from sidecar.grpcwire.limits import ServerLimits

_U32 = struct.Struct(">I")


class ReceiveCredit:
    """Mixin of Connection."""

    # Kept by the rest of Connection.
    _limits: ServerLimits
    _counters: ServerCounters
    _out: bytearray
    _end: Callable[[Call, int, str], None]
    _exhausted: Callable[[Call, str], None]

    def _init_credit(self, limits: ServerLimits) -> None:
        # The initial stream window we grant a new call.
        self._stream_window = limits.stream_window
        # Connection level: the credit the peer has, and credit earned (bytes consumed, or
        # messages reserved) not yet sent in a WINDOW_UPDATE. It may go negative: credit
        # granted for a reserved message that then never came.
        self._recv_window = limits.connection_window
        self._credit_due = 0
        self._credit_batch = limits.connection_window // 2
        self._stream_credit_batch = limits.stream_window // 2
        # Bytes reserved for this connection's unfinished messages.
        self._reserved = 0

    def _earn(self, credit: int) -> None:
        """Connection credit for consumed bytes; sent once half the window is due."""
        due = self._credit_due + credit
        if due < self._credit_batch:
            self._credit_due = due
            return
        room = MAX_WINDOW - self._recv_window  # (reservations may add up to more than that)
        grant = due if due <= room else room
        self._credit_due = due - grant
        if grant > 0:
            self._out += f.window_update(0, grant)
            self._recv_window += grant

    def _reserve(self, call: Call) -> None:
        """Reserve room for the unfinished message in the inbox (once its prefix is in) and
        grant the credit to send the rest of it; or end the call if there is no room."""
        inbox = call.inbox
        if len(inbox) < 5:
            return
        size = 5 + _U32.unpack_from(inbox, 1)[0]
        if call.open_method:
            self._reserve_open(call, size)
            return
        on_connection = self._reserved + size
        in_total = self._counters.buffered_bytes + size
        if (on_connection > self._limits.connection_buffer_bytes
                or in_total > self._limits.total_buffer_bytes):
            self._exhausted(call, "no buffer room for the message: the server is busy")
            return
        self._reserved = on_connection
        self._counters.buffered_bytes = in_total
        self._grant(call, size)

    def _grant(self, call: Call, size: int) -> None:
        call.reserved = size
        expected = call.expected = size - len(call.inbox)
        self._credit_due += expected
        call.credit_due += expected

    def _reserve_open(self, call: Call, size: int) -> None:
        """An open-method (health) call's message: reserved against its own small budget
        (`open_method_buffer_bytes`), never the authenticated calls' caps; and only its
        first message (its answer not yet sent)."""
        counters = self._counters
        in_total = counters.open_method_buffered_bytes + size
        if call.headers_sent:
            self._end(call, INVALID_ARGUMENT, "one request message per call")
        elif in_total > self._limits.open_method_buffer_bytes:
            self._exhausted(call, "no buffer room for calls without the channel token")
        else:
            counters.open_method_buffered_bytes = in_total
            self._grant(call, size)
            return
        consume(call, "inbox", len(call.inbox))

    def _release(self, call: Call) -> None:
        reserved = call.reserved
        if reserved:
            if call.open_method:
                self._counters.open_method_buffered_bytes -= reserved
            else:
                self._reserved -= reserved
                self._counters.buffered_bytes -= reserved
            call.reserved = 0
            # Credit granted for bytes that will not come now is paid back from what
            # later bytes earn.
            self._credit_due -= call.expected
            call.expected = 0

    def _drop_inbox(self, call: Call) -> None:
        """A call with a reserved message is finished: the message goes (a FrameWriter
        hook)."""
        self._release(call)
        consume(call, "inbox", len(call.inbox))
