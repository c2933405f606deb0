"""The sidecar's end of telemetry: decisions, access-log results and fallback transitions go
to the telemetry worker process (worker.py) as plain tuples, in the order they happened.

On the request path this is one tuple of references, marshalled, and one list append
(`decided`); the access log's side is the same (`finished`, `fallback`). Every `FLUSH_AT`
items, and every `FLUSH_S` for the rest, the list is sent in chunks without blocking over a
Unix SEQPACKET socket (one message per chunk, never split). What the worker cannot take yet
waits here, at most `queue_size` items; beyond that items are dropped and counted
(`telemetry_dropped_handoff`), never waited for. The worker reports every half second:
those reports feed `/metrics` (its queue, its drops, the join's counts, and the counters
of the rows it made).

A worker that dies is started again after a pause that doubles up to 30 s
(`telemetry_worker_restarts`); decisions it held unjoined come back as `log_only` rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import astuple, replace
from typing import Any

from sidecar.billing import Rates
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.observe.attempts import Transition
from sidecar.telemetry.deferral import DeferralPolicy
from sidecar.telemetry.intake import ITEMS_PER_MESSAGE, MAX_MESSAGE
from sidecar.telemetry.results import RequestResult, result_record
from sidecar.telemetry.rows import (
    CanaryEventRow,
    DecisionFacts,
    MirrorRow,
    ShadowRow,
    decision_record,
    price_records,
)
from sidecar.telemetry.worker import Start

FLUSH_AT = ITEMS_PER_MESSAGE  # a message stays well below the socket buffer
FLUSH_S = 0.05
SOCKET_BUFFER = 1 << 20
MAX_PAUSE_S = 30.0
READY_WITHIN_S = 5.0   # the worker's import and the store's opening (at most 2 s of it)

log = logging.getLogger("sidecar.telemetry")
_limited = LogLimiter(log, burst=1, interval=60.0)
AddCounts = Callable[[Mapping[tuple[str, ...], int]], None]
# The worker's figures that only grow: a restarted worker's start from zero again.
_CUMULATIVE = ("evicted", "written", "deferrals")


class TelemetryHandoff:
    def __init__(self, start: Start, add_counts: AddCounts, limit: int) -> None:
        """`limit`: the most items held for the worker (`telemetry.handoff_size`)."""
        self._start = start
        self._add_counts = add_counts
        self._limit = limit
        self._buffer: list[bytes] = []   # each item marshalled
        self._channel: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._pause = 0.0
        self._behind = False      # the socket was full: wait for the next tick
        self._unsent: bytes | None = None  # the first chunk, encoded, when it did not fit
        self._closing = False
        self._status: dict[str, Any] = {}
        self._reported = asyncio.Event()
        self._earlier: dict[str, int] = {}   # what workers that ended had counted
        self.dropped = 0
        self.restarts = 0

    # ---- the request path ---------------------------------------------------------------

    def decided(self, facts: DecisionFacts) -> None:
        self._add(("d", decision_record(facts)))

    def wants(self, request_id: str) -> bool:
        return True  # every request has a row

    def finished(self, result: RequestResult) -> None:
        self._add(("r", result_record(result)))

    def fallback(self, transition: Transition) -> None:
        self._add(("f", (transition.request_id, time.time(), transition.group,
                         transition.from_target, transition.to_target, transition.attempt,
                         transition.error_class)))

    def shadow(self, row: ShadowRow) -> None:
        """A group's shadow rollup (evaluation/shadow.py); a few per group a minute."""
        self._add(("s", astuple(row)))

    def canary(self, row: CanaryEventRow) -> None:
        """A canary's event (rollout/canary_guard.py): a withdrawal, once per candidate."""
        self._add(("c", astuple(row)))

    def mirror(self, row: MirrorRow) -> None:
        """A mirrored request beside its live answer (rollout/shadow_traffic.py)."""
        self._add(("m", astuple(row)))

    def _add(self, item: tuple[str, Any]) -> None:
        """Encoded at once: bytes are no work for the garbage collector, whereas the tuple
        and the trace's maps it holds, kept until the next flush, would outlive a young
        collection and make full ones come sooner (docs/telemetry.md §3)."""
        buffer = self._buffer
        if len(buffer) >= self._limit:
            self.dropped += 1
            return
        try:
            buffer.append(marshal.dumps(item))
        except ValueError:  # a value that is no plain scalar: a bug, not the load
            _limited.exception("telemetry_encode", "telemetry item could not be encoded")
            self.dropped += 1
            return
        if len(buffer) >= FLUSH_AT and not self._behind:
            self.flush()

    @property
    def join_window_s(self) -> float:
        """The longest a request can take: the worker's join waits that long."""
        return self._start.max_age_s

    def reconfigure(self, prices: Mapping[str, Rates], max_age_s: float) -> None:
        """A reload's prices, for rows joined from now on, and the longest a request can
        now take, for the join (and both for a restarted worker)."""
        records = price_records(prices)
        self._start = replace(self._start, prices=records, max_age_s=max_age_s)
        # Past the limit: never dropped.
        self._buffer.append(marshal.dumps(("p", (records, max_age_s))))

    # ---- the worker ---------------------------------------------------------------------

    async def start(self, ready_within_s: float = READY_WITHIN_S) -> TelemetryHandoff:
        """Start the worker, and wait (a bounded time) for its first report: the store's
        schema exists once the sidecar is ready, unless the database does not answer."""
        self._loop = asyncio.get_running_loop()
        self._spawn()
        self._timer = self._loop.call_later(FLUSH_S, self._tick)
        try:
            await asyncio.wait_for(self._reported.wait(), ready_within_s)
        except TimeoutError:
            log.warning("telemetry worker not ready after %.0f s; its rows wait for it",
                        ready_within_s)
        return self

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            self._process = subprocess.Popen(
                [sys.executable, "-m", "sidecar.telemetry.worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
            ours.send(pickle.dumps(self._start))
        except OSError:
            ours.close()
            _limited.exception("telemetry_spawn", "telemetry worker could not start")
            self._retry_later()
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._channel = ours
        assert self._loop is not None
        self._loop.add_reader(ours.fileno(), self._receive)

    def _tick(self) -> None:
        self._behind = False
        self.flush()
        if not self._closing:
            assert self._loop is not None
            self._timer = self._loop.call_later(FLUSH_S, self._tick)

    def flush(self) -> None:
        """Send what is buffered, as far as the socket takes it now. The sent items leave
        the buffer in one cut at the end: cutting a long buffer per message would move
        all of it each time."""
        channel, buffer = self._channel, self._buffer
        sent = 0
        try:
            while sent < len(buffer) and channel is not None:
                message, self._unsent = self._unsent, None
                if message is None:
                    message = marshal.dumps(buffer[sent:sent + FLUSH_AT])
                try:
                    channel.send(message)
                except BlockingIOError:  # the worker is behind: the rest waits for a tick
                    self._unsent, self._behind = message, True
                    return
                except OSError:
                    self._lost()
                    return
                sent += FLUSH_AT
        finally:
            del buffer[:sent]

    def _receive(self) -> None:
        channel = self._channel
        if channel is None:
            return
        while True:
            try:
                message = channel.recv(MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:
                self._lost()
                return
            try:
                status = marshal.loads(message)
                self._add_counts(status.pop("counts"))
            except (ValueError, EOFError, TypeError, KeyError, AttributeError):
                continue
            self._status = status
            self._reported.set()

    def _lost(self) -> None:
        """The worker's end closed: it ended (or died). Keep its counts; start another."""
        channel, self._channel = self._channel, None
        self._unsent = None  # its chunk is still buffered: a new worker gets it again
        if channel is not None:
            assert self._loop is not None
            self._loop.remove_reader(channel.fileno())
            channel.close()
        for key in _CUMULATIVE:
            self._earlier[key] = self._earlier.get(key, 0) + int(self._status.get(key, 0))
        for reason, n in self._status.get("dropped", {}).items():
            self._earlier[reason] = self._earlier.get(reason, 0) + n
        self._status = {}
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(0.1)
        if not self._closing:
            log.error("telemetry worker ended (exit %s); starting another",
                      self._process.returncode if self._process is not None else None)
            self.restarts += 1
            self._retry_later()

    def _retry_later(self) -> None:
        if self._closing or self._loop is None:
            return
        self._pause = min(MAX_PAUSE_S, max(1.0, self._pause * 2))
        self._loop.call_later(self._pause, self._respawn)

    def _respawn(self) -> None:
        if not self._closing and self._channel is None:
            self._spawn()

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Hand over what is buffered, let the worker write it, and wait for it to end."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        channel, process = self._channel, self._process
        if channel is None or process is None:
            return
        # A worker leaving its input waiting reads again within one deferral (deferral.py).
        deadline = time.monotonic() + timeout_s + DeferralPolicy().max_defer_s
        while self._buffer and self._channel is not None and time.monotonic() < deadline:
            self.flush()
            if self._buffer:
                await asyncio.sleep(0.01)
        with contextlib.suppress(OSError):
            channel.shutdown(socket.SHUT_WR)
        try:
            await asyncio.to_thread(process.wait, timeout_s + self._start.close_timeout_s)
        except subprocess.TimeoutExpired:
            log.error("telemetry worker did not end in time; stopping it")
            process.kill()
            await asyncio.to_thread(process.wait)
        self._receive()  # its last report
        if self._channel is not None:
            self._lost()

    # ---- /metrics -----------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        status, earlier = self._status, self._earlier
        dropped = status.get("dropped", {})
        figures = {
            "telemetry_pending_joins": status.get("pending", 0),
            "telemetry_joins_evicted": earlier.get("evicted", 0) + status.get("evicted", 0),
            "telemetry_queue_depth": status.get("depth", 0) + len(self._buffer),
            "telemetry_rows_written": earlier.get("written", 0) + status.get("written", 0),
            "telemetry_dropped_handoff": self.dropped,
            "telemetry_worker_up": int(self._channel is not None and bool(status)),
            "telemetry_worker_restarts": self.restarts,
            "telemetry_deferrals": earlier.get("deferrals", 0) + status.get("deferrals", 0),
        }
        for reason in ("queue_full", "write_error"):
            figures[f"telemetry_dropped_{reason}"] = (earlier.get(reason, 0)
                                                      + dropped.get(reason, 0))
        return {name: float(value) for name, value in figures.items()}
