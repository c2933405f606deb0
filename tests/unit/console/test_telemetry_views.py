"""What the console reads from telemetry is the reports' own figures (one code path): the
views of one read equal `report` by each key, rolled-up days included; the time views add
up to the totals; a read past its time stops with ReportTooLong."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sidecar.console.telemetry_views import Period, bucket_key, errors, usage
from sidecar.telemetry.database import SQLiteDatabase
from sidecar.telemetry.reports import (
    Filters,
    ReportTooLong,
    fallback_views,
    report,
    report_views,
    view_key,
)
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import FallbackRow, request_row
from sidecar.telemetry.store import TelemetryStore

DAY = 86_400


def seeded(tmp_path: Path, now: float) -> SQLiteDatabase:
    path = tmp_path / "t.db"
    store = TelemetryStore(SQLiteDatabase(path), raw_retention_days=1)
    rows = [request_row(None, RequestResult(f"r{n}", 200 if n % 5 else 500,
                                            ("p/a", "q/b", "p/c")[n % 3], 1,
                                            "ok" if n % 5 else "server_error", 10.0 * n, 5.0,
                                            100, 20, 0), {}, "log_only",
                        now - 3 * DAY - 600 * n if n % 2 else now - 300 * n)
            for n in range(1, 41)]
    store.write(rows, [FallbackRow(f"r{n}", now - 400 * n, "", "g", "p/a", 1, "timeout")
                       for n in range(1, 6)])
    store.maintain(now)  # the old half goes to the daily rollups
    store.close()
    db = SQLiteDatabase(path, read_only=True)
    db.open()
    return db


def test_views_are_the_reports_and_time_adds_up(tmp_path: Path) -> None:
    now = time.time()
    db = seeded(tmp_path, now)
    filters = Filters(now - 7 * DAY, now + 1)
    views = report_views(db, "usage", filters, {by: view_key(by) for by in
                                                ("target", "caller", "group", "day")}
                         | {"time": bucket_key(3600)})
    for by in ("target", "caller", "group", "day"):
        assert views[by] == report(db, "usage", filters, by), by
    assert sum(r["requests"] for r in views["time"]) == 40
    assert round(sum(r["cost_usd"] for r in views["time"]), 6) == round(
        sum(r["cost_usd"] for r in views["target"]), 6)
    transitions, series = fallback_views(db, filters, 600)
    assert transitions == report(db, "fallbacks", filters)
    assert sum(r["count"] for r in series) == 5
    period = Period.of("7d", None, None, now)
    assert usage(db, period)["target"] == views["target"]
    found = errors(db, period)
    assert found["fallbacks"] == transitions and found["by_target"] == views["target"]
    with pytest.raises(ReportTooLong):
        report_views(db, "usage", filters, {"target": view_key("target")}, max_seconds=-1)
    db.close()


def test_periods_are_bounded_and_unknown_ones_are_the_default() -> None:
    assert Period.of("10y", None, None, 1e9).name == "1h"
    week = Period.of("7d", "g", "c", 1e9)
    assert week.filters.since == 1e9 - 7 * DAY and (week.filters.group, week.filters.caller) \
        == ("g", "c")
    assert (week.span[1] - week.span[0]) / week.step_s <= 30
