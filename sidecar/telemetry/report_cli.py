"""`sidecar report usage|decisions|fallbacks`: the reports of docs/telemetry.md §4, read from
the telemetry database (the configuration's `telemetry.sqlite_path`, or `--db`), printed as
a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from sidecar.telemetry.reports import Filters, parse_since, report
from sidecar.text_table import format_table


def run_report(kind: str, db: Path, since: str, until: str | None, group: str | None,
               caller: str | None, by: str, output: str) -> str:
    if not db.exists():
        raise OSError(f"no telemetry database at {db} (is telemetry.sqlite_path set?)")
    now = time.time()
    filters = Filters(parse_since(since, now), parse_since(until, now) if until else now + 1,
                      group, caller)
    # Read-only: a report never writes, and never blocks the sidecar's writer for long.
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        rows = report(conn, kind, filters, by)
    finally:
        conn.close()
    if output == "json":
        return json.dumps({"report": kind, "by": by, "since": filters.since,
                           "until": filters.until, "rows": rows}, indent=2)
    flat = [{k: _cell(v) for k, v in row.items()} for row in rows]
    if output == "csv":
        buffer = io.StringIO()
        if flat:
            writer = csv.DictWriter(buffer, fieldnames=list(flat[0]))
            writer.writeheader()
            writer.writerows(flat)
        return buffer.getvalue().rstrip("\n")
    return _table(flat) if flat else f"no {kind} in that period"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
    return str(value)


def _table(rows: list[dict[str, str]]) -> str:
    header = list(rows[0])
    return format_table([header, *([row[h] for h in header] for row in rows)])
