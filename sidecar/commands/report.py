"""`sidecar report usage|decisions|fallbacks` and `sidecar rollup`: the reports and the
maintenance of docs/telemetry.md §4–§5, on the configured telemetry database (SQLite or
PostgreSQL) or a SQLite file given with `--db`. Reports print as a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

from sidecar.commands.text_table import format_table
from sidecar.config.service_settings import Telemetry
from sidecar.telemetry.canary_report import canary_report
from sidecar.telemetry.database import Database, open_database
from sidecar.telemetry.mirror_report import mirror_report
from sidecar.telemetry.reports import Filters, parse_since, report, shadow_report
from sidecar.telemetry.store import TelemetryStore


def filters_for(since: str, until: str | None, group: str | None, caller: str | None,
                now: float) -> Filters:
    return Filters(parse_since(since, now), parse_since(until, now) if until else now + 1,
                   group, caller)


def report_document(db: Database, kind: str, filters: Filters, by: str) -> dict[str, Any]:
    document = {"report": kind, "by": by, "since": filters.since, "until": filters.until,
                "rows": report(db, kind, filters, by)}
    if kind == "decisions":  # and how each group's shadow policy would have decided
        document["shadow"] = shadow_report(db, filters)
        document["canary"] = canary_report(db, filters)  # and each canary's sides
        document["shadow_traffic"] = mirror_report(db, filters)  # and mirrored candidates
    return document


def run_report(kind: str, settings: Telemetry, since: str, until: str | None,
               group: str | None, caller: str | None, by: str, output: str) -> str:
    filters = filters_for(since, until, group, caller, time.time())
    # Read-only: a report never writes, and never blocks the sidecar's writer for long.
    db = open_database(settings, read_only=True)
    db.open()
    try:
        document = report_document(db, kind, filters, by)
    finally:
        db.close()
    if output == "json":
        return json.dumps(document, indent=2)
    rows = document["rows"]
    flat = [{k: _cell(v) for k, v in row.items()} for row in rows]
    shadow = [{k: _cell(v) for k, v in row.items()} for row in document.get("shadow", [])]
    if output == "csv":
        return csv_text(rows)
    text = _table(flat) if flat else f"no {kind} in that period"
    if shadow:
        text += "\n\nshadow policies against the live ones:\n" + _table(shadow)
    canary = document.get("canary") or {}
    if canary.get("sides"):
        text += "\n\ncanaries, by side:\n" + _table(
            [{k: _cell(v) for k, v in row.items()} for row in canary["sides"]])
    if canary.get("events"):
        text += "\n\ncanaries withdrawn:\n" + _table(
            [{k: _cell(v) for k, v in row.items()} for row in canary["events"]])
    if document.get("shadow_traffic"):
        text += "\n\nshadow traffic, candidates beside the live answers:\n" + _table(
            [{k: _cell(v) for k, v in row.items()} for row in document["shadow_traffic"]])
    return text


def csv_text(rows: list[dict[str, Any]]) -> str:
    """A report's rows as CSV (`--format csv`, and the console's export)."""
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    return buffer.getvalue().rstrip("\n")


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


def run_rollup(settings: Telemetry, now: float | None = None) -> str:
    """One maintenance run now: roll up finished days, expire raw rows past retention."""
    store = TelemetryStore(open_database(settings), settings.replica,
                           settings.raw_retention_days)
    try:
        done = store.maintain(time.time() if now is None else now)
    finally:
        store.close()
    lines = [f"rolled up: {', '.join(done.rolled_up) or 'nothing new'}",
             f"raw rows expired: {done.raw_rows_deleted} "
             f"({', '.join(done.expired) or 'no day past retention'})"]
    if done.skipped_locked:
        lines.append("another replica is rolling up; the rest is left to it")
    return "\n".join(lines)
