"""How the telemetry worker takes in the sidecar's messages (docs/telemetry.md §3): when to
read, and how fast, so that its work runs where it costs the request path least.

- **Calm** (it keeps up): one message at a time with a short rest after each, and the
  writer paced, so every run of the worker is short.
- **Deferring**: nothing is read while the machine's CPUs are contended (deferral.py), for
  a bounded time; the work moves to after the burst.
- **Hurrying**: no rests and the writer unpaced, once the worker has been behind for
  `HURRY_AFTER_S` outside deferrals (its paced pace is not enough), until it finds nothing
  waiting. A deferral that ran out is followed by a paced catch-up, not a hurried one:
  measured, hurrying right after a burst raised the latency of the requests after it.

In every mode a message is read only when the writer has room for its rows. What the
worker does not take yet waits in the socket and in the sidecar's hand-over buffer (bounded
there by `telemetry.handoff_size`, drops counted), so catching up loses nothing that fits.
With `worker_priority: normal` there is no pacing and no deferral: it reads as it comes.

Every `REPORT_S` the worker's status goes back to the sidecar; at the end of input (the
sidecar closed its end, or died) the rest is written and the last status sent.
"""

from __future__ import annotations

import logging
import marshal
import select
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.telemetry.deferral import Deferral

if TYPE_CHECKING:
    from sidecar.telemetry.worker import Worker

ITEMS_PER_MESSAGE = 64   # the most items one message from the sidecar holds (handoff.py)
MAX_MESSAGE = 1 << 20
REPORT_S = 0.5
SWEEP_S = 5.0
# How long the first report waits for the store's schema (a database that does not answer
# must not hold the sidecar's start for longer).
OPEN_WAIT_S = 2.0
ROOM_WAIT_S = 0.01       # how often a full writer is looked at again
READ_REST_S = 0.002      # calm: the rest after each message (~0.2 ms of reading)
HURRY_AFTER_S = 5.0      # behind this long outside deferrals: hurry

log = logging.getLogger("sidecar.telemetry")


class Intake:
    def __init__(self, worker: Worker, pressure: Callable[[], float] | None = None,
                 deferral: Deferral | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """`pressure`: the share of time CPUs were contended since its last call
        (deferral.CpuPressure.share); without it, or without `deferral`, nothing waits.
        The reads rest as the writer does: only when it is paced."""
        self._worker = worker
        self._paced = worker.writer.pacing is not None
        self._pressure = pressure if deferral is not None else None
        self._deferral = deferral
        self._clock = clock
        self._sleep = sleep
        self._next_check = 0.0
        self._deferring = False
        self._behind_since: float | None = None

    def run(self, channel: socket.socket, close_timeout_s: float) -> None:
        """Report once the store is open (or `OPEN_WAIT_S` has passed), then read until
        the sidecar's end closes."""
        worker = self._worker
        worker.writer.start()
        worker.writer.opened.wait(OPEN_WAIT_S)
        self._report(channel)
        channel.setblocking(False)
        poller = select.poll()
        poller.register(channel.fileno(), select.POLLIN)
        now = self._clock()
        next_report, next_sweep = now + REPORT_S, now + SWEEP_S
        while True:
            now = self._clock()
            if now >= next_sweep:
                next_sweep = now + SWEEP_S
                worker.joiner.sweep()
            if now >= next_report:
                next_report = now + REPORT_S
                self._report(channel)
            if not worker.writer.has_room(ITEMS_PER_MESSAGE):
                self._sleep(ROOM_WAIT_S)
                continue
            if self._defer(now):
                continue
            message = self._next(channel, poller, now)
            if message == b"":
                break
            if message:
                try:
                    worker.take(marshal.loads(message))
                except Exception:
                    log.exception("telemetry batch could not be read")
                if self._paced and not worker.writer.hurry:
                    self._sleep(READ_REST_S)
        worker.joiner.sweep(everything=True)  # outcomes that can no longer come
        worker.writer.close(close_timeout_s)
        if worker.spans is not None:
            worker.spans.close()
        self._report(channel)

    def _defer(self, now: float) -> bool:
        """True (after a pause) while the input is left waiting."""
        deferral, pressure = self._deferral, self._pressure
        if deferral is None or pressure is None:
            return False
        if now >= self._next_check:
            self._next_check = now + deferral.policy.check_s
            self._deferring = deferral.defer(now, pressure())
        if self._deferring:
            self._behind_since = None  # time deferred is not time behind
            self._sleep(deferral.policy.check_s)
        return self._deferring

    def _next(self, channel: socket.socket, poller: select.poll,
              now: float) -> bytes | None:
        """The next message; b"" at the end of input, None when none came within
        REPORT_S. Finding nothing waiting is what being caught up means."""
        message = _waiting(channel)
        if message is None:
            self._behind_since = None
            self._worker.writer.hurry = False
            if self._deferral is not None:
                self._deferral.caught_up()
            if poller.poll(REPORT_S * 1000):
                message = _waiting(channel)
            return message
        if self._behind_since is None:
            self._behind_since = now
        self._worker.writer.hurry = now - self._behind_since >= HURRY_AFTER_S
        return message

    def _report(self, channel: socket.socket) -> None:
        status = self._worker.status()
        try:
            channel.send(marshal.dumps(status), socket.MSG_DONTWAIT)
        except OSError:  # full (the counts go with a later report) or gone
            self._worker.unsent(status)


def _waiting(channel: socket.socket) -> bytes | None:
    try:
        return channel.recv(MAX_MESSAGE)
    except BlockingIOError:
        return None
    except OSError:  # the sidecar is gone: as good as the end of input
        return b""
