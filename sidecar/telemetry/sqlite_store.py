"""SQLite storage for telemetry rows: the embedded default (docs/telemetry.md §3).

Opened by the writer thread that uses it (SQLite connections belong to one thread), in WAL
mode with `synchronous=NORMAL`: a crash may lose the last batches, never corrupt the file.
Each batch is one transaction.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

from sidecar.telemetry.rows import FallbackRow, RequestRow
from sidecar.telemetry.schema import (
    FALLBACK_COLUMNS,
    MIGRATIONS,
    REQUEST_COLUMNS,
    fallback_values,
    insert_sql,
    request_values,
)


class SQLiteStore:
    def __init__(self, path: Path, replica: str = "") -> None:
        self._path = path
        self._replica = replica
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self._path, timeout=5.0, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        migrate(db)
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def write(self, requests: Sequence[RequestRow], fallbacks: Sequence[FallbackRow]) -> None:
        if self._db is None:
            self.open()
        db = self._db
        assert db is not None
        with _transaction(db):
            if requests:
                db.executemany(insert_sql("request_rows", REQUEST_COLUMNS, "?"),
                               [request_values(self._replica, r) for r in requests])
            if fallbacks:
                db.executemany(insert_sql("fallback_transitions", FALLBACK_COLUMNS, "?"),
                               [fallback_values(self._replica, r) for r in fallbacks])


def migrate(db: sqlite3.Connection) -> int:
    """Apply the migrations not yet applied; the schema version afterwards."""
    db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
    done = {v for (v,) in db.execute("SELECT version FROM schema_migrations")}
    for version, statements in MIGRATIONS:
        if version in done:
            continue
        with _transaction(db):
            for statement in statements:
                db.execute(statement)
            db.execute("INSERT INTO schema_migrations (version) VALUES (?)", (version,))
    return max(done | {v for v, _ in MIGRATIONS})


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One explicit transaction (the connection is in autocommit mode)."""
    db.execute("BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
