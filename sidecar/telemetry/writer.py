"""The background writer: rows leave the event loop through a bounded buffer and reach the
store in batches on one thread (docs/telemetry.md §3).

The event loop only calls `offer`: one `deque.append` (atomic, no lock, no wake-up), or a
drop counted when `queue_size` rows are already waiting. The writer thread wakes every
`flush_interval_s`, takes what is there, makes the rows (counting and tracing them) and
writes them in chunks of `batch_size`, stepping aside every 20 rows so the loop never waits
for the interpreter lock behind a long batch. A
`queue.Queue` measured far worse here: its per-row lock and wake-up cost the loop CPU and
made the writer thread fight the loop for the lock on every row (p99 +12 ms at one request
at a time, bench/results/telemetry_cost.md).

A failing store drops the chunk, counts it, logs at most once a minute per kind and is
reopened on the next chunk after a pause that doubles up to 30 s; the request path never
notices. The same thread runs the store's maintenance (daily rollups, retention) every
`maintenance_interval_s`, between chunks. `close` writes what is buffered (up to a
deadline) and stops the thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.telemetry.rows import FallbackRow, RequestRow

Row = RequestRow | FallbackRow
# Rows made between two hand-overs of the interpreter lock (~15 µs each), and how long the
# thread steps aside: a request never waits behind more than a slice (bench/telemetry_cost).
_SLICE = 20
_YIELD_S = 0.0002

log = logging.getLogger("sidecar.telemetry")
_limited = LogLimiter(log, burst=1, interval=60.0)


class Store(Protocol):
    def open(self) -> None:
        ...

    def write(self, requests: Sequence[RequestRow], fallbacks: Sequence[FallbackRow]) -> None:
        ...

    def close(self) -> None:
        ...

    def maintain(self, now: float) -> object:
        ...


class TelemetryWriter:
    """`prepare` turns what was offered into a row on this thread (the join offers pairs
    unbuilt); each `observer` (metrics, spans) sees every row before it is stored."""

    def __init__(self, store: Store, queue_size: int = 10_000, batch_size: int = 200,
                 flush_interval_s: float = 0.25,
                 maintenance_interval_s: float | None = None,
                 first_maintenance_s: float = 60.0,
                 prepare: Callable[[Any], Row] = lambda row: row,
                 observers: Sequence[Callable[[Row], object]] = ()) -> None:
        self._store = store
        self._prepare = prepare
        self._observers = tuple(observers)
        self._buffer: deque[Any] = deque()
        self._limit = queue_size
        self._batch_size = batch_size
        self._flush = flush_interval_s
        self._maintenance_interval = maintenance_interval_s
        # The first run waits a minute: not in the start-up rush.
        self._next_maintenance = time.monotonic() + first_maintenance_s
        self.maintenance_runs = {"ok": 0, "error": 0}
        self.dropped = {"queue_full": 0, "write_error": 0}
        self.written = 0
        self._stop = threading.Event()
        self.opened = threading.Event()  # the store's first opening was tried
        self._deadline = 0.0  # set by close: how long the last drain may take
        self._thread = threading.Thread(target=self._run, name="telemetry-writer",
                                        daemon=True)
        self._pause = 0.0

    def start(self) -> TelemetryWriter:
        self._thread.start()
        return self

    @property
    def depth(self) -> int:
        return len(self._buffer)

    def offer(self, row: Any) -> bool:
        """Buffer a row for writing; False (and counted) when the buffer is full."""
        if len(self._buffer) >= self._limit:
            self.dropped["queue_full"] += 1
            return False
        self._buffer.append(row)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        self._deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._thread.join(timeout_s + 1.0)

    def _run(self) -> None:
        try:  # the schema exists from the start, not from the first row
            self._store.open()
        except Exception:
            _limited.exception("telemetry_open", "telemetry store cannot be opened yet")
        self.opened.set()
        while True:
            stopping = self._stop.wait(self._flush)
            self._maybe_maintain()
            self._drain(stopping)
            if stopping:
                break
        try:
            self._store.close()
        except Exception:  # closing a broken store must not raise out of the thread
            _limited.exception("telemetry_close", "telemetry store did not close cleanly")

    def _drain(self, stopping: bool) -> None:
        """Write what is buffered now, a chunk at a time (rows arriving meanwhile wait for
        the next wake-up, so one drain is bounded)."""
        pending = len(self._buffer)
        while pending > 0:
            if stopping and time.monotonic() > self._deadline:
                return
            take = min(pending, self._batch_size)
            chunk = [self._buffer.popleft() for _ in range(take)]
            pending -= take
            rows: list[Row] = []
            for start in range(0, take, _SLICE):
                rows += self._rows(chunk[start:start + _SLICE])
                time.sleep(_YIELD_S)  # hand the interpreter to the event loop
            self._write(rows)

    def _maybe_maintain(self) -> None:
        if self._maintenance_interval is None or time.monotonic() < self._next_maintenance:
            return
        self._next_maintenance = time.monotonic() + self._maintenance_interval
        try:
            done = self._store.maintain(time.time())
        except Exception:
            self.maintenance_runs["error"] += 1
            _limited.exception("telemetry_maintain", "telemetry rollup/retention failed")
            with contextlib.suppress(Exception):
                self._store.close()
            return
        self.maintenance_runs["ok"] += 1
        log.info("telemetry maintenance: %s", done)

    def _rows(self, chunk: list[Any]) -> list[Row]:
        rows = []
        for item in chunk:
            try:
                row = self._prepare(item)
                for observe in self._observers:
                    observe(row)
            except Exception:  # a bug, not the database: skip the row, keep the thread
                _limited.exception("telemetry_row", "telemetry row could not be made")
                continue
            rows.append(row)
        return rows

    def _write(self, rows: list[Row]) -> None:
        requests = [r for r in rows if isinstance(r, RequestRow)]
        fallbacks = [r for r in rows if isinstance(r, FallbackRow)]
        try:
            self._store.write(requests, fallbacks)
        except Exception:
            self.dropped["write_error"] += len(rows)
            _limited.exception("telemetry_write", "telemetry batch of %d rows dropped",
                               len(rows))
            with contextlib.suppress(Exception):
                self._store.close()
            self._pause = min(30.0, max(0.5, self._pause * 2))
            self._stop.wait(self._pause)
            return
        self._pause = 0.0
        self.written += len(rows)
