"""The telemetry store: the schema, batches of rows and maintenance on one database
(SQLite or PostgreSQL, sidecar/telemetry/database.py), used by the writer thread.

Opening migrates: numbered migrations (schema.py) that have not run yet run in order, each in
one transaction that holds the migration lock, so replicas starting together apply each
migration once. Each batch of rows is one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from sidecar.telemetry import encode
from sidecar.telemetry.database import Database, sql
from sidecar.telemetry.rollup import Maintenance, maintain
from sidecar.telemetry.rows import CanaryEventRow, FallbackRow, MirrorRow, RequestRow, ShadowRow
from sidecar.telemetry.schema import (
    CANARY_COLUMNS,
    FALLBACK_COLUMNS,
    MIGRATION_LOCK,
    MIGRATIONS,
    MIRROR_COLUMNS,
    REQUEST_COLUMNS,
    SHADOW_COLUMNS,
    canary_values,
    fallback_values,
    insert_sql,
    mirror_values,
    request_values,
    shadow_values,
)
from sidecar.telemetry.writer import CANARY, FALLBACK, MIRROR, REQUEST, SHADOW

Values = tuple[object, ...]
# A RequestRow's values (REQUEST_COLUMNS order) in the order the INSERT names the columns.
_IN_INSERT_ORDER = itemgetter(*(REQUEST_COLUMNS.index(c) for c in encode.COLUMNS))
_INSERT_REQUESTS = insert_sql("request_rows", encode.COLUMNS)
_INSERT_FALLBACKS = insert_sql("fallback_transitions", FALLBACK_COLUMNS)
_INSERT_SHADOWS = insert_sql("shadow_rollups", SHADOW_COLUMNS)
_INSERT_CANARIES = insert_sql("canary_events", CANARY_COLUMNS)
_INSERT_MIRRORS = insert_sql("shadow_requests", MIRROR_COLUMNS)


class TelemetryStore:
    def __init__(self, db: Database, replica: str = "", raw_retention_days: int = 30) -> None:
        self.db = db
        self._replica = replica
        self._retention_days = raw_retention_days
        self._open = False

    def open(self) -> None:
        self.db.open()
        migrate(self.db)
        self._open = True

    def close(self) -> None:
        self._open = False
        self.db.close()

    @property
    def replica(self) -> str:
        return self._replica

    @property
    def where(self) -> str:
        """The database, as log lines name it (no credentials)."""
        return self.db.where

    def values(self, row: RequestRow | FallbackRow | ShadowRow | CanaryEventRow
               ) -> tuple[int, Values]:
        """A row object as `write_values` takes it: (its table, its values)."""
        if isinstance(row, CanaryEventRow):
            return CANARY, canary_values(self._replica, row)
        if isinstance(row, MirrorRow):
            return MIRROR, mirror_values(self._replica, row)
        if isinstance(row, FallbackRow):
            return FALLBACK, fallback_values(self._replica, row)
        if isinstance(row, ShadowRow):
            return SHADOW, shadow_values(self._replica, row)
        return REQUEST, _IN_INSERT_ORDER(request_values(self._replica, row))

    def write(self, requests: Sequence[RequestRow], fallbacks: Sequence[FallbackRow],
              shadows: Sequence[ShadowRow] = (),
              canaries: Sequence[CanaryEventRow] = (),
              mirrors: Sequence[MirrorRow] = ()) -> None:
        self.write_values(*([self.values(r)[1] for r in rows]
                            for rows in (requests, fallbacks, shadows, canaries, mirrors)))

    def write_values(self, requests: Sequence[Values], fallbacks: Sequence[Values],
                     shadows: Sequence[Values] = (), canaries: Sequence[Values] = (),
                     mirrors: Sequence[Values] = ()) -> None:
        """One transaction: request rows in `encode.COLUMNS` order, fallback rows, shadow
        rollups, canary events, mirrored requests."""
        if not self._open:
            self.open()
        with self.db.transaction() as cursor:
            if requests:
                cursor.executemany(sql(_INSERT_REQUESTS, self.db), requests)
            if fallbacks:
                cursor.executemany(sql(_INSERT_FALLBACKS, self.db), fallbacks)
            if shadows:
                cursor.executemany(sql(_INSERT_SHADOWS, self.db), shadows)
            if canaries:
                cursor.executemany(sql(_INSERT_CANARIES, self.db), canaries)
            if mirrors:
                cursor.executemany(sql(_INSERT_MIRRORS, self.db), mirrors)

    def maintain(self, now: float) -> Maintenance:
        """Daily rollups and raw-row retention (rollup.py)."""
        if not self._open:
            self.open()
        return maintain(self.db, now, self._retention_days)


def migrate(db: Database) -> int:
    """Apply the migrations not yet applied; the schema version afterwards."""
    with db.transaction(lock=MIGRATION_LOCK) as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                       "(version INTEGER PRIMARY KEY)")
        done = {v for (v,) in cursor.execute("SELECT version FROM schema_migrations").fetchall()}
        for version, statements in MIGRATIONS:
            if version in done:
                continue
            for statement in statements:
                cursor.execute(statement)
            cursor.execute(sql("INSERT INTO schema_migrations (version) VALUES ({p})", db),
                           (version,))
            done.add(version)
    return max(done)
