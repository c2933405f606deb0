"""The store and the background writer (docs/telemetry.md §3): rows reach the database in
batches (SQLite and PostgreSQL); a full queue or a failing store drops and counts rows, never
blocks the caller."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.telemetry.database import Database, SQLiteDatabase
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import FallbackRow, RequestRow, request_row
from sidecar.telemetry.schema import LATEST
from sidecar.telemetry.store import TelemetryStore, migrate
from sidecar.telemetry.writer import FALLBACK, REQUEST, Pacing, TelemetryWriter


def row(n: int) -> RequestRow:
    return request_row(None, RequestResult(f"r{n}", 200, "p/a", 1, "ok", 10.0, 2.0, 5, 7, 0),
                       {}, "log_only", at=1_700_000_000.0 + n)


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_rows_reach_the_database_in_batches_with_the_schema_versioned(
        database: Database) -> None:
    writer = TelemetryWriter(TelemetryStore(database, replica="r-1"), batch_size=50,
                             flush_interval_s=0.05).start()
    for n in range(120):
        assert writer.offer(row(n))
    writer.offer(FallbackRow("r1", 1.0, "g", "p/a", "p/b", 1, "server_error"))
    writer.close()
    assert writer.written == 121 and writer.dropped == {"queue_full": 0, "write_error": 0}
    with database.transaction() as db:
        assert db.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)
        count, tokens, replica = db.execute(
            "SELECT count(*), sum(output_tokens), min(replica) FROM request_rows").fetchone()
        assert (count, tokens, replica) == (120, 840, "r-1")
        shape, join = db.execute("SELECT request_shape, join_kind FROM request_rows").fetchone()
        assert json.loads(shape) == {} and join == "log_only"
        assert db.execute("SELECT from_target, to_target FROM fallback_transitions"
                          ).fetchall() == [("p/a", "p/b")]
    assert migrate(database) == LATEST  # applying again is a no-op


def test_sqlite_is_in_wal_mode(tmp_path: Path) -> None:
    store = TelemetryStore(SQLiteDatabase(tmp_path / "t.db"))
    store.open()
    store.close()
    assert sqlite3.connect(tmp_path / "t.db").execute("PRAGMA journal_mode").fetchone() == (
        "wal",)


def test_replicas_starting_together_migrate_once(database: Database, tmp_path: Path) -> None:
    """Four stores opening the same database at once: every one ends on the latest schema,
    each migration recorded once (the migration lock serializes them)."""
    if isinstance(database, SQLiteDatabase):
        make = lambda: SQLiteDatabase(database.path)  # noqa: E731
    else:
        from sidecar.telemetry.postgres import PostgresDatabase

        make = lambda: PostgresDatabase(database._dsn)  # noqa: E731
    errors: list[BaseException] = []

    def start() -> None:
        store = TelemetryStore(make())
        try:
            store.open()
        except BaseException as exc:
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with database.transaction() as db:
        versions = [v for (v,) in db.execute(
            "SELECT version FROM schema_migrations ORDER BY version").fetchall()]
    assert versions == list(range(1, LATEST + 1))


class StalledStore:
    """A database that hangs until released, then fails once."""

    where = "a stalled test store"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[int] = []
        self.fail_next = True

    def open(self) -> None:
        pass

    def values(self, row: RequestRow | FallbackRow) -> tuple[int, tuple[object, ...]]:
        return (REQUEST if isinstance(row, RequestRow) else FALLBACK), (row.request_id,)

    def write_values(self, requests: Sequence[tuple], fallbacks: Sequence[tuple],
                     *others: Sequence[tuple]) -> None:
        self.release.wait(30)
        if self.fail_next:
            self.fail_next = False
            raise OSError("database unreachable")
        self.batches.append(len(requests))

    def close(self) -> None:
        pass

    def maintain(self, now: float) -> None:
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


def test_maintenance_runs_on_the_writer_thread_on_schedule_and_survives_errors() -> None:
    calls: list[str] = []

    class Maintained(StalledStore):
        def maintain(self, now: float) -> None:
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                raise OSError("database went away")

    store = Maintained()
    store.release.set()
    store.fail_next = False
    writer = TelemetryWriter(store, flush_interval_s=0.01, maintenance_interval_s=0.05,
                             first_maintenance_s=0.0).start()
    wait_for(lambda: len(calls) >= 3)
    writer.offer(row(1))
    writer.close()
    assert set(calls) == {"telemetry-writer"}
    assert writer.maintenance_runs["error"] == 1 and writer.maintenance_runs["ok"] >= 2
    assert writer.written == 1


def test_rows_are_made_on_the_writer_thread_and_a_bad_one_is_skipped() -> None:
    seen: list[tuple[str, str]] = []
    written: list[int] = []

    class Counting(StalledStore):
        def write_values(self, requests: Sequence[tuple], fallbacks: Sequence[tuple],
                         *others: Sequence[tuple]) -> None:
            written.append(len(requests))

    def prepare(n: int) -> tuple[int, tuple[object, ...]]:
        if n == 3:
            raise ValueError("a bug in row building")
        seen.append((threading.current_thread().name, f"r{n}"))
        return REQUEST, (f"r{n}",)

    writer = TelemetryWriter(Counting(), flush_interval_s=0.01, prepare=prepare).start()
    for n in range(50):
        assert writer.offer(n)
    wait_for(lambda: sum(written) == 49)
    writer.close()
    assert {name for name, _ in seen} == {"telemetry-writer"}
    assert len(seen) == 49 and ("telemetry-writer", "r3") not in seen


class Rests:
    """The writer's rests, recorded instead of slept; `closing_after` rests report a close."""

    def __init__(self, closing_after: int | None = None) -> None:
        self.taken: list[float] = []
        self._closing_after = closing_after

    def __call__(self, seconds: float) -> bool:
        self.taken.append(seconds)
        return self._closing_after is not None and len(self.taken) >= self._closing_after


def paced_drain(rests: Rests, rows: int, hurry: bool = False
                ) -> tuple[TelemetryWriter, list[int]]:
    """`rows` offered before the writer starts, so its first drain sees them all."""
    store = StalledStore()
    store.release.set()
    store.fail_next = False
    writer = TelemetryWriter(store, batch_size=50, flush_interval_s=0.01,
                             pacing=Pacing(chunk=16, rest_s=0.002), rest=rests)
    writer.hurry = hurry
    for n in range(rows):
        writer.offer(row(n))
    writer.start()
    wait_for(lambda: writer.written == rows)
    writer.close()
    return writer, store.batches


def test_a_paced_writer_that_keeps_up_writes_small_chunks_with_rests_between() -> None:
    """Why: a long run of the worker delays request-path processes of other scheduling
    groups (docs/telemetry.md §8); small chunks with rests keep every run short."""
    rests = Rests()
    _, batches = paced_drain(rests, rows=40)
    assert batches == [16, 16, 8]
    assert rests.taken == [0.002, 0.002]  # between chunks, none after the last


def test_a_hurried_writer_writes_full_chunks_without_rests() -> None:
    """The worker's intake hurries it once it has fallen behind (intake.py)."""
    rests = Rests()
    writer, batches = paced_drain(rests, rows=230, hurry=True)
    assert batches == [50, 50, 50, 50, 30] and rests.taken == []
    assert writer.dropped == {"queue_full": 0, "write_error": 0}


def test_closing_ends_the_rests_and_writes_the_rest_in_full_chunks() -> None:
    rests = Rests(closing_after=1)
    _, batches = paced_drain(rests, rows=200)
    assert batches == [16, 50, 50, 50, 34] and len(rests.taken) == 1
