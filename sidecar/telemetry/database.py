"""The telemetry database connection: SQLite (embedded default) or PostgreSQL (several
replicas), behind one small interface so the store, rollups and reports share their SQL
(docs/telemetry.md §3).

SQL is written once with `{p}` for the bound-parameter placeholder; `sql()` fills in `?` or
`%s`. Values are always bound, never formatted in.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from sidecar.config.secrets import read_secret
from sidecar.config.service_settings import Telemetry


class Database(Protocol):
    placeholder: str
    # What log lines call it (`SQLite at PATH`, `PostgreSQL at host:port/db`): never a
    # password (sidecar/dependency_names.py).
    where: str

    def open(self) -> None:
        ...

    def close(self) -> None:
        ...

    def transaction(self, lock: int | None = None) -> contextlib.AbstractContextManager[Any]:
        """A cursor inside one transaction, committed when the block ends without error.
        With `lock`, the transaction first takes that cluster-wide lock (PostgreSQL advisory
        lock; SQLite's write lock is already exclusive) so replicas do one job once."""
        ...

    def try_transaction(self, lock: int) -> contextlib.AbstractContextManager[Any | None]:
        """Like `transaction(lock)`, but yields None at once when another replica holds it."""
        ...


def sql(text: str, db: Database) -> str:
    return text.replace("{p}", db.placeholder)


class SQLiteDatabase:
    """One connection, used by one thread (SQLite connections belong to their thread).

    WAL with `synchronous=NORMAL`: a crash may lose the last batches, never corrupt the
    file. Read-only connections (reports) never take the write lock."""

    placeholder = "?"

    def __init__(self, path: Path, read_only: bool = False, timeout_s: float = 5.0) -> None:
        self.path = path
        self.where = f"SQLite at {path}"
        self._read_only = read_only
        self._timeout = timeout_s
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        if self._read_only:
            if not self.path.exists():
                raise OSError(f"no telemetry database at {self.path}")
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                       timeout=self._timeout, check_same_thread=False)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        # Switching to WAL needs a moment alone with the file and does not wait for it like
        # other statements do: retry while another connection (a second process) holds it.
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    db.close()
                    raise
                time.sleep(0.01)
        db.execute("PRAGMA synchronous=NORMAL")
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @contextlib.contextmanager
    def transaction(self, lock: int | None = None) -> Iterator[sqlite3.Cursor]:
        if self._db is None:
            self.open()
        db = self._db
        assert db is not None
        if self._read_only:
            yield db.cursor()
            return
        db.execute("BEGIN IMMEDIATE")  # the write lock now, not at the first write
        try:
            yield db.cursor()
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextlib.contextmanager
    def try_transaction(self, lock: int) -> Iterator[sqlite3.Cursor | None]:
        with self.transaction(lock) as cursor:
            yield cursor


def open_database(settings: Telemetry, read_only: bool = False) -> Database:
    """The configured database, not yet connected. Raises ValueError when telemetry is off,
    SecretError when the DSN cannot be read, ImportError text when psycopg is missing."""
    if settings.sqlite_path is not None:
        return SQLiteDatabase(settings.sqlite_path, read_only=read_only)
    if settings.postgres_dsn is not None:
        from sidecar.telemetry.postgres import PostgresDatabase

        source = settings.postgres_dsn
        return PostgresDatabase(read_secret(source.env, source.file, os.environ))
    raise ValueError("telemetry is off: set telemetry.sqlite_path or telemetry.postgres_dsn")
