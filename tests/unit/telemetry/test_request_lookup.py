"""The rows of one trace (sidecar/telemetry/request_lookup.py), read back by `sidecar
rollout check` through `GET /requests?trace=`: SQLite and PostgreSQL, the checklist's rows
only, bounded in rows and time, the trace id checked before anything is read, and the
partial index that makes the lookup read nothing else."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.telemetry.database import Database
from sidecar.telemetry.request_lookup import MAX_ROWS, rows_of_trace
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import origin, request_row
from sidecar.telemetry.store import TelemetryStore

NOW = 1_700_000_000.0
CHECK = "c4ec1157" + "ab" * 12
OTHER = "4bf92f3577b34da6a3ce929d0e0e4736"


def traced(n: int, trace_id: str, at: float):  # type: ignore[no-untyped-def]
    row = request_row(None, RequestResult(f"r{n}", 200, "p/a", 1, "ok", 10.0, 2.0, 5, 7, 0),
                      {}, "log_only", at=at)
    traceparent = f"00-{trace_id}-{n:016x}-01"
    return dataclasses.replace(row, traceparent=traceparent, origin=origin(traceparent))


def test_a_trace_s_rows_are_found_and_no_one_else_s(database: Database) -> None:
    store = TelemetryStore(database, replica="r-1")
    store.write([traced(1, CHECK, NOW - 5), traced(2, OTHER, NOW - 4),
                 traced(3, CHECK, NOW - 3), traced(4, CHECK, NOW - 4_000)], [])
    found = rows_of_trace(database, CHECK, since_s=900, now=NOW)
    assert [r["request_id"] for r in found] == ["r1", "r3"]  # r4 is older than asked
    assert {r["origin"] for r in found} == {"rollout_check"}
    # Another request's row is not reachable by its trace id: checklist rows only.
    assert rows_of_trace(database, OTHER, since_s=900, now=NOW) == []
    # At most an hour back, whatever is asked.
    assert len(rows_of_trace(database, CHECK, since_s=10**9, now=NOW)) == 2
    store.close()


def test_at_most_max_rows_and_a_bad_trace_id_reads_nothing(database: Database) -> None:
    store = TelemetryStore(database, replica="r-1")
    store.write([traced(n, CHECK, NOW - 1) for n in range(MAX_ROWS + 5)], [])
    assert len(rows_of_trace(database, CHECK, since_s=60, now=NOW)) == MAX_ROWS
    for bad in ("%", CHECK.upper(), CHECK[:-1], "0" * 32, CHECK + "%"):
        with pytest.raises(ValueError, match="32 lowercase"):
            rows_of_trace(database, bad, since_s=60, now=NOW)
    store.close()


def test_the_lookup_reads_through_the_checklist_index(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite's plan for the lookup uses the partial index (so rows of other requests are
    never read), whatever the table holds."""
    from sidecar.telemetry.database import SQLiteDatabase
    from sidecar.telemetry.request_lookup import lookup_query

    database = SQLiteDatabase(tmp_path / "t.db")
    store = TelemetryStore(database, replica="r-1")
    store.write([traced(n, OTHER, NOW - 1) for n in range(200)], [])
    with database.transaction() as cursor:
        plan = cursor.execute("EXPLAIN QUERY PLAN " + lookup_query(database),
                              [NOW - 60, "00-x%"]).fetchall()
    assert "request_rows_checklist" in " ".join(str(step) for step in plan), plan
    store.close()
