"""The background writer: rows leave the event loop through a bounded buffer and reach the
store in batches on one thread (docs/telemetry.md §3).

It runs in the telemetry worker process (worker.py), whose reading thread only calls
`offer`: one `deque.append` (atomic, no lock, no wake-up), or a drop counted when
`queue_size` rows are already waiting. The writer thread wakes every `flush_interval_s`,
takes what is there, has `prepare` make each item into a row's values (the worker's
encoder counts and traces them there) and writes them in chunks of `batch_size`.

In the worker the writer is paced (`Pacing`): it writes small chunks and rests between
them, so it never holds a CPU for long. Its scheduling class alone does not give way at
once to the request path's processes when they sit in other scheduling groups (sessions,
containers), and a long run then delays them; measured in docs/telemetry.md §8. When the
worker's reader finds it has fallen behind it sets `hurry`: full chunks without rests.

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
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.grpcwire.ratelimit import LogLimiter

Values = tuple[object, ...]
# What `prepare` makes of an item: (its table, its values).
REQUEST, FALLBACK, SHADOW, CANARY, MIRROR = 0, 1, 2, 3, 4
Prepared = tuple[int, Values]

log = logging.getLogger("sidecar.telemetry")
_limited = LogLimiter(log, burst=1, interval=60.0)


class Store(Protocol):
    where: str  # the database, as log lines name it (no credentials)

    def open(self) -> None:
        ...

    def values(self, row: Any) -> Prepared:
        ...

    def write_values(self, requests: Sequence[Values], fallbacks: Sequence[Values],
                     shadows: Sequence[Values] = (), canaries: Sequence[Values] = (),
                     mirrors: Sequence[Values] = ()) -> None:
        ...

    def close(self) -> None:
        ...

    def maintain(self, now: float) -> object:
        ...


@dataclass(frozen=True)
class Pacing:
    """Chunks of `chunk` rows, `rest_s` apart, unless hurried. 16 rows are ~0.2 ms of the
    worker's CPU here; with 2 ms rests it takes about 7,000 rows per second."""

    chunk: int = 16
    rest_s: float = 0.002


class TelemetryWriter:
    """`prepare` turns what was offered into a row's values on this thread (the join offers
    pairs unbuilt); by default items are row objects (`store.values`)."""

    def __init__(self, store: Store, queue_size: int = 10_000, batch_size: int = 200,
                 flush_interval_s: float = 0.25,
                 maintenance_interval_s: float | None = None,
                 first_maintenance_s: float = 60.0,
                 prepare: Callable[[Any], Prepared] | None = None,
                 pacing: Pacing | None = None,
                 rest: Callable[[float], bool] | None = None) -> None:
        self._store = store
        self._prepare = prepare or store.values
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
        self.pacing = pacing
        self.hurry = False  # set by the worker's reader when it has fallen behind
        self._rest = rest or self._stop.wait  # True once closing: no more rests

    def start(self) -> TelemetryWriter:
        self._thread.start()
        return self

    @property
    def depth(self) -> int:
        return len(self._buffer)

    def has_room(self, rows: int) -> bool:
        """Room for `rows` more (an empty buffer always has room: a queue smaller than one
        message still takes what it can, and counts the rest)."""
        return len(self._buffer) <= max(0, self._limit - rows)

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
            _limited.exception("telemetry_open", "telemetry store (%s) cannot be opened yet",
                               self._store.where)
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
            _limited.exception("telemetry_close", "telemetry store (%s) did not close "
                               "cleanly", self._store.where)

    def _drain(self, stopping: bool) -> None:
        """Write what is buffered now, a chunk at a time (rows arriving meanwhile wait for
        the next wake-up, so one drain is bounded), resting between chunks when paced."""
        pending = len(self._buffer)
        resting = not stopping
        while pending > 0:
            if stopping and time.monotonic() > self._deadline:
                return
            paced = self._paced() if resting else None
            take = min(pending, paced.chunk if paced else self._batch_size)
            chunk = [self._buffer.popleft() for _ in range(take)]
            pending -= take
            self._write(*self._rows(chunk))
            if paced and pending:
                resting = not self._rest(paced.rest_s)  # closing: the rest goes at once

    def _paced(self) -> Pacing | None:
        return None if self.hurry else self.pacing

    def _maybe_maintain(self) -> None:
        if self._maintenance_interval is None or time.monotonic() < self._next_maintenance:
            return
        self._next_maintenance = time.monotonic() + self._maintenance_interval
        try:
            done = self._store.maintain(time.time())
        except Exception:
            self.maintenance_runs["error"] += 1
            _limited.exception("telemetry_maintain", "telemetry rollup/retention on %s "
                               "failed", self._store.where)
            with contextlib.suppress(Exception):
                self._store.close()
            return
        self.maintenance_runs["ok"] += 1
        log.info("telemetry maintenance: %s", done)  # Maintenance words itself (rollup.py)

    def _rows(self, chunk: list[Any]) -> tuple[list[Values], ...]:
        tables: tuple[list[Values], ...] = ([], [], [], [], [])
        prepare = self._prepare
        for item in chunk:
            try:
                table, values = prepare(item)
            except Exception:  # a bug, not the database: skip the row, keep the thread
                _limited.exception("telemetry_row", "telemetry row could not be made")
                continue
            tables[table].append(values)
        return tables

    def _write(self, *tables: list[Values]) -> None:
        rows = sum(len(table) for table in tables)
        try:
            self._store.write_values(*tables)
        except Exception:
            self.dropped["write_error"] += rows
            _limited.exception("telemetry_write", "telemetry batch of %d rows dropped (%s "
                               "did not take it)", rows, self._store.where)
            with contextlib.suppress(Exception):
                self._store.close()
            self._pause = min(30.0, max(0.5, self._pause * 2))
            self._stop.wait(self._pause)
            return
        self._pause = 0.0
        self.written += rows
