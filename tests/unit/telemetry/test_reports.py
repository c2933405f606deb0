"""Reports and rollups from a known synthetic event set against hand-computed figures, on
SQLite and PostgreSQL (issue #15); after retention expiry the same totals come from rollups."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.commands.report import report_document
from sidecar.observe.histogram import RELATIVE_ERROR
from sidecar.telemetry.database import Database, SQLiteDatabase
from sidecar.telemetry.reports import Filters, parse_since, percentile, report
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import FallbackRow, ShadowRow, request_row
from sidecar.telemetry.store import TelemetryStore

DAY1 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def made(n: int, target: str, at: float, caller: str, latency: float, tokens: tuple[int, int],
         cost: float | None, error: str = "ok", exclusions: str = ""):
    row = request_row(None, RequestResult(f"r{n}", 200 if error == "ok" else 503, target, 1,
                                          error, latency, 10.0, *tokens, 0), {}, "log_only", at)
    return replace(row, caller=caller, group="g", cost_usd=cost, strategy="dynamic_score",
                   complexity="simple" if n % 2 else "complex", exclusions=exclusions,
                   signals="cost,complexity")


@pytest.fixture
def conn(database: Database):
    store = TelemetryStore(database)
    store.write([
        made(1, "p/a", DAY1 + 10, "alice", 100.0, (100, 10), 0.001),
        made(2, "p/a", DAY1 + 20, "bob", 300.0, (200, 20), 0.002),
        made(3, "p/b", DAY1 + 30, "alice", 200.0, (50, 5), None, "server_error",
             exclusions="p/a:thresholds.max_error_rate"),
        made(4, "p/a", DAY1 + 86_400 + 5, "alice", 400.0, (10, 1), 0.0005),
    ], [FallbackRow("r3", DAY1 + 30, "g", "p/b", "p/a", 1, "server_error"),
        FallbackRow("r5", DAY1 + 40, "g", "p/b", "p/a", 1, "server_error")])
    yield database


ALL = Filters(since=DAY1, until=DAY1 + 2 * 86_400)


def test_usage_by_target_matches_hand_computed_figures(conn) -> None:
    a, b = report(conn, "usage", ALL, by="target")
    assert a == {"target": "p/a", "requests": 3, "errors": 0, "input_tokens": 310,
                 "output_tokens": 31, "cached_tokens": 0, "cache_write_tokens": 0,
                 "estimated_requests": 0,
                 "cost_usd": 0.0035,
                 "latency_p50_ms": 300.0, "latency_p95_ms": 400.0, "latency_p99_ms": 400.0,
                 "error_classes": {}}
    assert (b["requests"], b["errors"], b["error_classes"], b["cost_usd"]) == (
        1, 1, {"server_error": 1}, 0.0)


def test_usage_by_day_caller_and_filters(conn) -> None:
    days = report(conn, "usage", ALL, by="day")
    assert [(d["day"], d["requests"]) for d in days] == [("2026-01-01", 3), ("2026-01-02", 1)]
    alice = report(conn, "usage", replace(ALL, caller="alice"), by="caller")
    assert [(c["caller"], c["requests"]) for c in alice] == [("alice", 3)]
    assert report(conn, "usage", replace(ALL, group="other"), by="group") == []
    first_day = report(conn, "usage", replace(ALL, until=DAY1 + 86_400), by="group")
    assert first_day[0]["requests"] == 3


def test_decisions_count_buckets_stages_and_signals(conn) -> None:
    (entry,) = report(conn, "decisions", ALL, by="group")
    assert entry["requests"] == 4
    assert entry["complexity"] == {"complex": 2, "simple": 2}
    assert entry["exclusion_stages"] == {"thresholds.max_error_rate": 1}
    assert entry["signals"] == {"complexity": 4, "cost": 4}
    assert entry["max_tokens_filtered"] == {"no": 4}


def test_fallbacks_by_transition(conn) -> None:
    assert report(conn, "fallbacks", ALL) == [{"group": "g", "from_target": "p/b",
                                              "to_target": "p/a", "failure": "server_error",
                                              "count": 2}]


def test_since_and_percentiles() -> None:
    assert parse_since("24h", 100_000.0) == 100_000.0 - 86_400
    assert parse_since("30m", 0.0) == -1800
    with pytest.raises(ValueError, match="24h"):
        parse_since("yesterday", 0.0)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and percentile([], 0.5) is None


def test_the_report_command_prints_table_json_and_csv(tmp_path: Path) -> None:
    import csv
    import io
    import json
    import subprocess
    import sys
    import time

    db = tmp_path / "t.db"
    store = TelemetryStore(SQLiteDatabase(db))
    now = time.time()
    store.write([made(1, "p/a", now - 60, "alice", 120.0, (100, 10), 0.001),
                 made(2, "p/b", now - 30, "bob", 80.0, (50, 5), 0.0005)], [])
    store.close()

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "sidecar", "report", *args, "--db",
                               str(db)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = run("usage", "--since", "1h")
    assert table.splitlines()[0].split()[:3] == ["target", "requests", "errors"]
    assert "p/a" in table and "p/b" in table
    document = json.loads(run("usage", "--by", "caller", "--format", "json"))
    assert [r["caller"] for r in document["rows"]] == ["alice", "bob"]
    rows = list(csv.DictReader(io.StringIO(run("decisions", "--format", "csv"))))
    assert [r["requests"] for r in rows] == ["1", "1"]
    assert "no usage in that period" in run("usage", "--since", "10s")


def test_docs_operations_names_every_column_of_every_table() -> None:
    from sidecar.telemetry.schema import (
        CANARY_COLUMNS,
        FALLBACK_COLUMNS,
        MIRROR_COLUMNS,
        REQUEST_COLUMNS,
        SHADOW_COLUMNS,
    )

    text = (Path(__file__).parents[3] / "docs" / "operations.md").read_text()
    missing = [c for c in {*REQUEST_COLUMNS, *FALLBACK_COLUMNS, *SHADOW_COLUMNS,
                            *CANARY_COLUMNS, *MIRROR_COLUMNS}
               if f"`{c}`" not in text]
    assert missing == []


def test_the_decisions_report_sums_shadow_rollups_per_group_and_policies(database) -> None:
    """Issue #31: a shadow policy's agreement and mean differences over the period."""
    store = TelemetryStore(database, replica="r1")
    store.write([], [], [
        ShadowRow(DAY1 + 10, "g", "live1", "shadow1", 100, 60, -0.02, 150.0, 0.01, 0),
        ShadowRow(DAY1 + 20, "g", "live1", "shadow1", 100, 40, -0.04, 250.0, 0.03, 5),
        ShadowRow(DAY1 + 30, "other", "live2", "shadow2", 10, 10, 0.0, 0.0, 0.0, 0),
        ShadowRow(DAY1 - 30, "g", "live1", "shadow1", 999, 0, 9.0, 9.0, 9.0, 9),  # before
    ])
    document = report_document(database, "decisions", ALL, "group")
    g, other = document["shadow"]
    assert g == {"group": "g", "policy_version": "live1", "shadow_version": "shadow1",
                 "decisions": 200, "agreement_rate": 0.5,
                 "mean_cost_delta_usd": pytest.approx(-0.0003),
                 "mean_latency_delta_ms": pytest.approx(2.0),
                 "mean_error_rate_delta": pytest.approx(0.0002), "dropped": 5}
    assert other["agreement_rate"] == 1.0
    only = report_document(database, "decisions", replace(ALL, group="other"), "group")
    assert [r["group"] for r in only["shadow"]] == ["other"]
    assert report_document(database, "usage", ALL, "group").get("shadow") is None


# --- daily rollups and retention -----------------------------------------------------------

NOW = DAY1 + 3 * 86_400 + 7200  # 2026-01-04T02:00Z: days 1–3 are finished


def rich(n: int, at: float, target: str = "p/a", error: str = "ok") -> object:
    row = made(n, target, at, "alice" if n % 3 else "bob", 50.0 + 37 * n, (10 * n, n),
               0.0001 * n, error, exclusions="p/b:thresholds.max_p95_latency_ms"
               if n % 4 == 0 else "")
    return replace(row, request_shape={"stream": n % 2 == 0, "input_size": "small"},
                   selected_scores={"cost": "high", "latency": "mid"}, affinity="hit",
                   max_tokens_filtered=n % 5 == 0)


def totals(rows: list[dict]) -> list[dict]:
    """A report without its percentiles (a rollup keeps them to within one histogram step)."""
    return [{k: v for k, v in r.items() if not k.startswith("latency_")} for r in rows]


def test_after_retention_the_same_totals_come_from_rollups(database: Database) -> None:
    store = TelemetryStore(database, raw_retention_days=1)
    day1 = [rich(n, DAY1 + 60 * n) for n in range(1, 40)]
    day2 = [rich(n, DAY1 + 86_400 + 60 * n, "p/b", "server_error" if n % 7 == 0 else "ok")
            for n in range(40, 60)]
    store.write(day1 + day2, [FallbackRow(f"f{n}", DAY1 + n, "g", "p/b", "p/a", 1, "timeout")
                              for n in range(5)])
    everything = Filters(DAY1, NOW)
    before = {(kind, by): report(database, kind, everything, by)
              for kind in ("usage", "decisions", "fallbacks")
              for by in ("target", "caller", "group", "day")}

    done = store.maintain(NOW)
    # Day 1 and 2 ended more than a day before NOW: rolled up and their raw rows expired.
    assert done.expired == ["2026-01-01", "2026-01-02"] and done.rolled_up == []
    assert done.raw_rows_deleted == 39 + 20 + 5
    with database.transaction() as cursor:
        assert cursor.execute("SELECT count(*) FROM request_rows").fetchone() == (0,)
        assert cursor.execute("SELECT count(*) FROM daily_usage").fetchone()[0] > 0
    for (kind, by), expected in before.items():
        after = report(database, kind, everything, by)
        assert totals(after) == totals(expected), (kind, by)
    usage_after = report(database, "usage", everything, "target")
    for old, new in zip(before[("usage", "target")], usage_after, strict=True):
        for name in ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms"):
            # the observation store's histogram: within half a bucket
            assert abs(new[name] - old[name]) <= old[name] * RELATIVE_ERROR + 1e-9
    assert store.maintain(NOW) == type(done)()  # nothing left to do


def test_late_rows_of_a_rolled_day_count_once_it_expires(database: Database) -> None:
    store = TelemetryStore(database, raw_retention_days=2)
    store.write([rich(1, DAY1 + 100)], [])
    assert store.maintain(DAY1 + 86_400 + 3601).rolled_up == ["2026-01-01"]
    store.write([rich(2, DAY1 + 200)], [])  # arrives after the first rollup
    (raw,) = report(database, "usage", Filters(DAY1, DAY1 + 86_400), "group")
    assert raw["requests"] == 2  # a rolled day still in retention reads its raw rows only
    assert store.maintain(DAY1 + 3 * 86_400).expired == ["2026-01-01"]
    (entry,) = report(database, "usage", Filters(DAY1, DAY1 + 86_400), "group")
    assert (entry["requests"], entry["input_tokens"]) == (2, 30)


def test_a_day_within_the_grace_hour_is_not_rolled_up(database: Database) -> None:
    store = TelemetryStore(database)
    store.write([rich(1, DAY1 + 100)], [])
    assert store.maintain(DAY1 + 86_400 + 3599).rolled_up == []
    assert store.maintain(DAY1 + 86_400 + 3600).rolled_up == ["2026-01-01"]


def test_a_replica_finding_another_rolling_up_skips(postgres_dsn: str) -> None:
    from sidecar.telemetry.postgres import PostgresDatabase
    from sidecar.telemetry.schema import ROLLUP_LOCK

    first, second = PostgresDatabase(postgres_dsn), PostgresDatabase(postgres_dsn)
    store = TelemetryStore(first)
    store.write([rich(1, DAY1 + 100)], [])
    try:
        with second.transaction(lock=ROLLUP_LOCK):  # another replica, mid-rollup
            done = store.maintain(NOW)
        assert done.skipped_locked and done.rolled_up == []
        assert store.maintain(NOW).rolled_up == ["2026-01-01"]
    finally:
        first.close()
        second.close()


def test_the_rollup_command_rolls_up_and_expires(tmp_path: Path) -> None:
    import subprocess
    import sys

    store = TelemetryStore(SQLiteDatabase(tmp_path / "t.db"))
    store.write([rich(1, DAY1 + 100)], [])
    store.close()
    done = subprocess.run([sys.executable, "-m", "sidecar", "rollup", "--db",
                           str(tmp_path / "t.db"), "--raw-retention-days", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "raw rows expired: 1 (2026-01-01)" in done.stdout
    missing = subprocess.run([sys.executable, "-m", "sidecar", "rollup", "--db",
                              str(tmp_path / "none.db")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "no telemetry database" in missing.stderr


def test_console_views_and_a_cut_read_on_either_store(database: Database) -> None:
    """Issue 43: the console's several views of one read equal the reports on SQLite and
    PostgreSQL (where rows come through a server-side cursor, so the time bound holds and
    memory is a batch); a read cut by its bound leaves the store usable."""
    from sidecar.telemetry.reports import ReportTooLong, report_views, view_key

    store = TelemetryStore(database)
    store.write([rich(n, DAY1 + 60 * n, "p/b" if n % 3 else "p/a",
                      "server_error" if n % 7 == 0 else "ok") for n in range(1, 3000)],
                [FallbackRow(f"f{n}", DAY1 + n, "g", "p/b", "p/a", 1, "timeout")
                 for n in range(5)])
    everything = Filters(DAY1, NOW)
    views = report_views(database, "usage", everything,
                         {by: view_key(by) for by in ("target", "caller", "group", "day")})
    for by, rows in views.items():
        assert rows == report(database, "usage", everything, by), by
    with pytest.raises(ReportTooLong):
        report_views(database, "usage", everything, {"target": view_key("target")},
                     max_seconds=-1)
    assert report(database, "usage", everything, "target") == views["target"]
    store.close()
