"""A connection's timers: the handshake deadline, the idle reaper, and the grace a closing
connection gets to flush what is queued.

Why apart: a peer must not hold a connection slot without speaking HTTP/2 or without using
it, and a closing peer must not keep its queued bytes forever; none of that concerns the
frames themselves. Why one timer: a `loop.call_later` handle per connection, never touched
on the hot path. The reader says when the handshake is done (`_handshake_done`), the
sender when the last call ended (`_became_idle`, a FrameWriter hook: one `loop.time()`),
and the idle timer, when it fires, looks at that and sleeps again for what is left.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sidecar.grpcwire import frames as f

if TYPE_CHECKING:
    from sidecar.grpcwire.call import Call
    from sidecar.grpcwire.counters import ServerCounters
    from sidecar.grpcwire.limits import ServerLimits


class ConnectionTimers:
    """Mixin of Connection. Without a loop (tests on a fake transport) there are no timers;
    tests that want them pass a fake loop (any object with `call_later` and `time`)."""

    # Kept by the rest of Connection.
    _transport: asyncio.Transport | None
    _limits: ServerLimits
    _counters: ServerCounters
    _calls: dict[int, Call]
    _out: bytearray
    _last_stream_id: int
    _settings_seen: bool
    going_away: bool

    def _init_timers(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0

    def _start_handshake_timer(self) -> None:
        if self._loop is not None:
            self._timer = self._loop.call_later(self._limits.handshake_timeout,
                                                self._handshake_expired)

    def _handshake_expired(self) -> None:
        self._timer = None
        if self._transport is not None and not self._settings_seen:
            self._counters.handshake_timeouts += 1
            self._transport.abort()  # it has not shown it speaks HTTP/2: nothing to say

    def _handshake_done(self) -> None:
        """The peer's first SETTINGS arrived: from now on the idle timer runs."""
        if self._loop is not None:
            self._cancel_timer()
            self._idle_since = self._loop.time()
            self._timer = self._loop.call_later(self._limits.idle_timeout, self._idle_check)

    def _became_idle(self) -> None:
        """The last open call is gone (called by FrameWriter._forget)."""
        if self._loop is not None:
            self._idle_since = self._loop.time()

    def _idle_check(self) -> None:
        """One timer per connection, never touched on the hot path: it looks at when the
        connection last became idle and sleeps again for what is left."""
        assert self._loop is not None
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        timeout = self._limits.idle_timeout
        idle_for = 0.0 if self._calls else self._loop.time() - self._idle_since
        if idle_for < timeout:
            self._timer = self._loop.call_later(timeout - idle_for, self._idle_check)
            return
        self._counters.idle_closed += 1
        self.going_away = True
        self._out += f.goaway(self._last_stream_id, f.NO_ERROR)
        self._close()

    def _cut_after_grace(self, transport: asyncio.Transport) -> None:
        """A closing connection whose peer does not read what is queued gets the handshake
        timeout to take it, then is cut."""
        if self._loop is not None:
            self._cancel_timer()
            self._timer = self._loop.call_later(self._limits.handshake_timeout,
                                                transport.abort)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
