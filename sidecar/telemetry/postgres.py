"""PostgreSQL for telemetry: several sidecar replicas write one database
(docs/telemetry.md §3).

psycopg 3 with a small connection pool (the writer thread and admin reports). Replicas
coordinate through transaction-scoped advisory locks: migrations run once (the others wait
and find them applied), a day is rolled up by whichever replica gets there first (the
others skip). Every connection has a connect timeout and a statement timeout, so a stalled
server costs the writer a failed batch (counted), never a hung thread.

The DSN is a secret (it may hold a password): it is never logged. Errors that could echo
it (a malformed DSN) are replaced by a fixed message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sidecar.dependency_names import postgres_endpoint

CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 30_000


class PostgresUnavailable(OSError):
    pass


class PostgresDatabase:
    placeholder = "%s"

    def __init__(self, dsn: str, max_connections: int = 3) -> None:
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError:
            raise PostgresUnavailable(
                "telemetry.postgres_dsn needs psycopg: "
                "pip install 'model-group-sidecar[postgres]'") from None
        self._dsn = dsn
        self.where = postgres_endpoint(dsn)  # host, port and database: no password
        self._max = max_connections
        self._pool: Any = None

    def __repr__(self) -> str:  # never the DSN
        return "PostgresDatabase(<dsn>)"

    def open(self) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        try:
            psycopg.conninfo.conninfo_to_dict(self._dsn)
        except psycopg.ProgrammingError:
            raise PostgresUnavailable("telemetry.postgres_dsn is not a valid "
                                      "PostgreSQL connection string") from None
        pool = ConnectionPool(
            self._dsn, min_size=1, max_size=self._max, open=False, timeout=CONNECT_TIMEOUT_S,
            name="sidecar-telemetry", check=ConnectionPool.check_connection,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S,
                    "application_name": "model-group-sidecar",
                    "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"})
        try:
            pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout:
            pool.close(timeout=1.0)
            raise PostgresUnavailable(f"telemetry {self.where} did not accept a connection "
                                      f"within {CONNECT_TIMEOUT_S} s") from None
        self._pool = pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close(timeout=1.0)
            self._pool = None

    @contextlib.contextmanager
    def transaction(self, lock: int | None = None) -> Iterator[Any]:
        if self._pool is None:
            self.open()
        with self._pool.connection() as conn, conn.transaction():
            cursor = conn.cursor()
            if lock is not None:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            yield cursor

    @contextlib.contextmanager
    def try_transaction(self, lock: int) -> Iterator[Any | None]:
        if self._pool is None:
            self.open()
        with self._pool.connection() as conn, conn.transaction():
            cursor = conn.cursor()
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock,))
            (held,) = cursor.fetchone()
            yield cursor if held else None
