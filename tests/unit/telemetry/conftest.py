"""Each storage test runs against SQLite and against a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.telemetry.database import Database, SQLiteDatabase


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty telemetry database, not yet opened."""
    if request.param == "sqlite":
        db: Database = SQLiteDatabase(tmp_path / "telemetry.db")
    else:
        from sidecar.telemetry.postgres import PostgresDatabase

        db = PostgresDatabase(request.getfixturevalue("postgres_dsn"))
    yield db
    db.close()
