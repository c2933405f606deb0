"""The SQLite store and the background writer (docs/telemetry.md §3): rows reach the file in
batches; a full queue or a failing store drops and counts rows, never blocks the caller."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.telemetry.rows import FallbackRow, RequestResult, RequestRow, request_row
from sidecar.telemetry.schema import LATEST
from sidecar.telemetry.sqlite_store import SQLiteStore, migrate
from sidecar.telemetry.writer import TelemetryWriter


def row(n: int) -> RequestRow:
    return request_row(None, RequestResult(f"r{n}", 200, "p/a", 1, "ok", 10.0, 2.0, 5, 7, 0),
                       {}, "log_only", at=1_700_000_000.0 + n)


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_rows_reach_sqlite_in_batches_with_the_schema_versioned(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    writer = TelemetryWriter(SQLiteStore(path, replica="r-1"), batch_size=50,
                             flush_interval_s=0.05).start()
    for n in range(120):
        assert writer.offer(row(n))
    writer.offer(FallbackRow("r1", 1.0, "g", "p/a", "p/b", 1, "server_error"))
    writer.close()
    assert writer.written == 121 and writer.dropped == {"queue_full": 0, "write_error": 0}
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)
    count, tokens, replica = db.execute(
        "SELECT count(*), sum(output_tokens), min(replica) FROM request_rows").fetchone()
    assert (count, tokens, replica) == (120, 840, "r-1")
    shape, join = db.execute("SELECT request_shape, join_kind FROM request_rows").fetchone()
    assert json.loads(shape) == {} and join == "log_only"
    assert db.execute("SELECT from_target, to_target FROM fallback_transitions").fetchall() == [
        ("p/a", "p/b")]
    assert migrate(db) == LATEST  # applying again is a no-op


class StalledStore:
    """A database that hangs until released, then fails once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[int] = []
        self.fail_next = True

    def open(self) -> None:
        pass

    def write(self, requests: Sequence[RequestRow], fallbacks: Sequence[FallbackRow]) -> None:
        self.release.wait(30)
        if self.fail_next:
            self.fail_next = False
            raise OSError("database unreachable")
        self.batches.append(len(requests))

    def close(self) -> None:
        pass


def test_a_stalled_then_failing_store_never_blocks_and_every_loss_is_counted() -> None:
    store = StalledStore()
    writer = TelemetryWriter(store, queue_size=100, batch_size=10, flush_interval_s=0.01).start()
    started = time.monotonic()
    accepted = sum(writer.offer(row(n)) for n in range(1_000))
    # 1,000 offers against a hung database return at once (generous for a slow machine).
    assert time.monotonic() - started < 2.0
    assert writer.dropped["queue_full"] == 1_000 - accepted and accepted <= 110
    store.release.set()
    wait_for(lambda: writer.depth == 0)
    writer.close()
    assert writer.dropped["write_error"] >= 1  # the failed batch, counted, not retried
    assert writer.written + writer.dropped["write_error"] == accepted
    assert sum(store.batches) == writer.written
