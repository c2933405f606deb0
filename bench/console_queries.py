"""Benchmark: the console's telemetry reads on a large store (issue 43; docs/console.md).

Builds a SQLite telemetry database of `--rows` request rows (default one million) with
fallback transitions, spread over the last `--days` days, all kept raw (the heaviest
case: a rolled-up day is a few rows), then times what each console page reads
(console/telemetry_views.py: `usage` and `errors`) for every period the pages offer, and
the page's rendering from that. A read longer than the console's bound
(`MAX_READ_SECONDS`) stops and the page says so: the table shows which periods do.

Usage:  PYTHONPATH=.:bench .venv/bin/python bench/console_queries.py [--rows 1000000]
            [--days 7] [--db /tmp/console-bench.db] [--output bench/results/console_queries.md]
Writes only the database it is given (kept for reruns when it already holds the rows).
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import time
from pathlib import Path

from mode_runner import publish

from sidecar.console import errors_page, usage_page
from sidecar.console.telemetry_views import MAX_READ_SECONDS, PERIODS, Period, errors, usage
from sidecar.telemetry.database import SQLiteDatabase
from sidecar.telemetry.reports import ReportTooLong
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import FallbackRow, request_row
from sidecar.telemetry.store import TelemetryStore

TARGETS = ("baseten/gpt-oss-120b", "minimax/m3", "openai/gpt-5.4-nano")
CALLERS = tuple(f"team-{n}" for n in range(20))
BATCH = 20_000


def build(path: Path, rows: int, days: int, now: float) -> None:
    """`rows` request rows at an even pace over `days` days up to `now`, plus one fallback
    transition in twenty, all raw."""
    store = TelemetryStore(SQLiteDatabase(path), raw_retention_days=days + 1)
    chance = random.Random(7)
    span = days * 86_400
    for start in range(0, rows, BATCH):
        batch, transitions = [], []
        for n in range(start, min(rows, start + BATCH)):
            at = now - span * (1 - n / rows)
            target = TARGETS[chance.randrange(3)]
            failed = chance.random() < 0.02
            result = RequestResult(f"r{n}", 503 if failed else 200, target, 1,
                                   "server_error" if failed else "ok",
                                   chance.lognormvariate(6, 0.5), 50.0,
                                   chance.randrange(50, 4000), chance.randrange(10, 800), 0)
            row = request_row(None, result, {}, "log_only", at)
            row.caller = CALLERS[n % len(CALLERS)]
            row.group = "adaptive-agent"
            row.complexity = ("simple", "standard", "complex")[n % 3]
            row.cost_usd = (result.input_tokens + 4 * result.output_tokens) / 1e6
            batch.append(row)
            if n % 20 == 0:
                transitions.append(FallbackRow(f"r{n}", at, "adaptive-agent", TARGETS[0],
                                               TARGETS[1], 1, "server_error"))
        store.write(batch, transitions)
    store.close()


def stored(path: Path) -> tuple[int, float]:
    """(rows, the newest row's start) of a database built before (0 when there is none)."""
    try:
        with sqlite3.connect(path) as db:
            count, newest = db.execute(
                "SELECT count(*), max(started_at) FROM request_rows").fetchone()
            return count, newest or 0.0
    except sqlite3.Error:
        return 0, 0.0


def measure(path: Path, now: float) -> list[tuple[str, str, float, str, float]]:
    """(period, page, read seconds, outcome, render seconds) for each period and page."""
    results = []
    for name in PERIODS:
        period = Period.of(name, None, None, now)
        for page, read in (("usage", usage), ("errors", errors)):
            db = SQLiteDatabase(path, read_only=True)
            db.open()
            started = time.perf_counter()
            try:
                found, outcome = read(db, period), "read"
            except ReportTooLong:
                found, outcome = None, f"stopped at {MAX_READ_SECONDS:g} s"
            took = time.perf_counter() - started
            db.close()
            started = time.perf_counter()
            if page == "usage":
                usage_page.render(period, found, None, [], [], [])
            else:
                errors_page.render(period, found, None, [], [])
            results.append((name, page, took, outcome, time.perf_counter() - started))
    return results


def report(results: list, rows: int, days: int, built_s: float | None) -> str:
    lines = [
        "# The console's telemetry reads on a large store",
        "",
        f"`bench/console_queries.py --rows {rows} --days {days}`, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: a SQLite store of {rows:,} request "
        f"rows over {days} days (about {rows // days:,} a day) with a fallback transition "
        "for one request in twenty, read as each console page reads it (one read of the "
        "period serves every table and chart of the page); rendering is the page's HTML "
        "from what was read."
        + (f" Building the store took {built_s:.0f} s." if built_s else ""),
        "",
        "| period | page | rows in period (about) | read s | outcome | render ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    per_second = rows / (days * 86_400)
    for name, page, took, outcome, render_s in results:
        seconds = PERIODS[name][0]
        lines.append(f"| {name} | {page} | {min(rows, round(per_second * seconds)):,} | "
                     f"{took:.2f} | {outcome} | {render_s * 1000:.1f} |")
    lines += ["", f"A read is bounded at {MAX_READ_SECONDS:g} s (console/telemetry_views.py); "
              "the page then names the bound and `sidecar report`, which has none."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--db", type=Path, default=Path("/tmp/console-bench.db"))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    now = time.time()
    built = None
    count, newest = stored(args.db)
    if count == args.rows:
        now = newest + 1  # the periods end where its rows do
    else:
        args.db.unlink(missing_ok=True)
        started = time.perf_counter()
        build(args.db, args.rows, args.days, now)
        built = time.perf_counter() - started
    publish(report(measure(args.db, now), args.rows, args.days, built), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
