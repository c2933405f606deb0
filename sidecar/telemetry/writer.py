"""The background writer: rows leave the event loop through a bounded queue and reach the
store in batches on one thread (docs/telemetry.md §3).

The event loop only calls `offer`, which never blocks: a full queue drops the row and counts
it. A failing store drops the batch, counts it, logs at most once a minute per kind and is
reopened on the next batch after a pause that doubles up to 30 s; the request path never
notices. The same thread runs the store's maintenance (daily rollups, retention) every
`maintenance_interval_s`, between batches. `close` drains what is queued (up to a deadline)
and stops the thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.telemetry.rows import FallbackRow, RequestRow

log = logging.getLogger("sidecar.telemetry")
_limited = LogLimiter(log, burst=1, interval=60.0)
_STOP = object()


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
    def __init__(self, store: Store, queue_size: int = 10_000, batch_size: int = 500,
                 flush_interval_s: float = 0.25,
                 maintenance_interval_s: float | None = None,
                 first_maintenance_s: float = 60.0) -> None:
        self._store = store
        self._maintenance_interval = maintenance_interval_s
        # The first run waits a minute: not in the start-up rush.
        self._next_maintenance = time.monotonic() + first_maintenance_s
        self.maintenance_runs = {"ok": 0, "error": 0}
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._batch_size = batch_size
        self._flush = flush_interval_s
        self.dropped = {"queue_full": 0, "write_error": 0}
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="telemetry-writer",
                                        daemon=True)
        self._pause = 0.0

    def start(self) -> TelemetryWriter:
        self._thread.start()
        return self

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def offer(self, row: RequestRow | FallbackRow) -> bool:
        """Queue a row for writing; False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            self.dropped["queue_full"] += 1
            return False
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._queue.put(_STOP, timeout=max(0.01, deadline - time.monotonic()))
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    break
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        try:  # the schema exists from the start, not from the first row
            self._store.open()
        except Exception:
            _limited.exception("telemetry_open", "telemetry store cannot be opened yet")
        stopping = False
        while not stopping:
            batch: list[object] = []
            self._maybe_maintain()
            try:
                batch.append(self._queue.get(timeout=self._flush))
            except queue.Empty:
                continue
            deadline = time.monotonic() + self._flush
            while len(batch) < self._batch_size:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            stopping = any(item is _STOP for item in batch)
            rows = [item for item in batch if item is not _STOP]
            if rows:
                self._write(rows)
        try:
            self._store.close()
        except Exception:  # closing a broken store must not raise out of the thread
            _limited.exception("telemetry_close", "telemetry store did not close cleanly")

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

    def _write(self, rows: list[object]) -> None:
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
            time.sleep(self._pause)
            return
        self._pause = 0.0
        self.written += len(rows)
