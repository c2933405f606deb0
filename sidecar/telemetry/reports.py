"""Reports over telemetry: usage, decisions and fallbacks (docs/telemetry.md §4).

Read-only queries on the telemetry database, aggregated in Python so one code path serves
SQLite and PostgreSQL (parameters are bound, never formatted in). A period reads the raw
rows it holds plus the daily rollups of days whose raw rows have expired, so reports over
old periods need no special flag; those days count whole (a rollup has no hours), and their
latency percentiles come from the rollup histogram (aggregate.py). Every value is a
configuration name, bucket name or number, like the rows.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.telemetry.aggregate import (
    DAY_S,
    Aggregate,
    day_of,
    day_start,
    decisions_entry,
    histogram_from_json,
    percentile,
    usage_entry,
)
from sidecar.telemetry.database import Database, sql

__all__ = ["BY", "KINDS", "Filters", "parse_since", "percentile", "report"]

KINDS = ("usage", "decisions", "fallbacks")
BY = {"target": "serving_target", "caller": "caller", "group": "group_name", "day": "day"}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_BATCH = 1000


@dataclass(frozen=True)
class Filters:
    since: float
    until: float
    group: str | None = None
    caller: str | None = None


def parse_since(text: str, now: float) -> float:
    """`24h`, `7d`, `30m`, `90s`: that long before `now` (epoch seconds)."""
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not match:
        raise ValueError(f"--since {text!r}: use a number and s, m, h or d (e.g. 24h)")
    return now - int(match.group(1)) * _UNITS[match.group(2)]


def report(db: Database, kind: str, filters: Filters, by: str = "target") -> list[dict[str, Any]]:
    if kind not in KINDS:
        raise ValueError(f"unknown report {kind!r} (one of: {', '.join(KINDS)})")
    if by not in BY:
        raise ValueError(f"--by {by!r}: one of {', '.join(BY)}")
    if kind == "fallbacks":
        with db.transaction() as cursor:
            return _fallbacks(cursor, db, filters, _expired_days(cursor, filters))
    return report_views(db, kind, filters, {by: lambda row, at: _key(row, by, at)})[by]


# What a usage report reads of a raw row (Aggregate.add_row without decision buckets, and
# the views' keys): a quarter of the columns, a quarter of the read.
USAGE_COLUMNS = ("started_at, group_name, caller, serving_target, complexity, error_class, "
                 "input_tokens, output_tokens, cached_tokens, cache_write_tokens, "
                 "usage_source, cost_usd, latency_ms")

# A view's key for a row (raw: `at` is its start; rolled up: the start of its day).
ViewKey = Callable[[dict[str, Any], float], str]


class ReportTooLong(Exception):
    """The period holds more rows than can be read within the time given."""


def report_views(db: Database, kind: str, filters: Filters, views: dict[str, ViewKey],
                 max_seconds: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """A usage or decisions report keyed several ways in one read of the period (the
    console's usage page: by target, caller, group and over time). Each view's rows are
    exactly what `report` gives for that key: one code path. Days read from rollups count
    at their start (a rollup has no hours). With `max_seconds`, a read that takes longer
    stops with ReportTooLong (checked every 1,000 rows)."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    keys = list(views.values())
    decisions = kind == "decisions"  # a usage report needs no decision buckets
    # Each row is added once, under all its view keys together; the views are merged from
    # those parts after the read (far fewer parts than rows).
    parts: dict[tuple[str, ...], Aggregate] = {}
    with db.transaction() as cursor:
        expired = _expired_days(cursor, filters)
        columns = "*" if decisions or not _has_usage_columns(cursor) else USAGE_COLUMNS
        # Closed here, not when collected: a cut read's server-side cursor must not
        # outlive its transaction (telemetry/postgres.py).
        with contextlib.closing(_raw(cursor, db, "request_rows", "started_at", filters,
                                     columns)) as rows:
            for read, row in enumerate(rows):
                if deadline is not None and not read % _BATCH and time.monotonic() > deadline:
                    raise ReportTooLong(f"more than {read:,} rows in the period")
                at = row["started_at"]
                key = tuple(view(row, at) for view in keys)
                part = parts.get(key)
                if part is None:
                    part = parts[key] = Aggregate()
                part.add_row(row, decisions=decisions)
        for day, group, caller, target, rolled in _rolled_up(cursor, db, filters, expired):
            row = {"day": day, "group_name": group, "caller": caller,
                   "serving_target": target or None}
            key = tuple(view(row, day_start(day)) for view in keys)
            parts.setdefault(key, Aggregate()).merge(rolled)
    entry = usage_entry if kind == "usage" else decisions_entry
    documents = {}
    for index, name in enumerate(views):
        totals: dict[str, Aggregate] = {}
        for key, part in parts.items():
            totals.setdefault(key[index], Aggregate()).merge(part)
        documents[name] = [entry(name, key, total) for key, total in sorted(totals.items())]
    return documents


def _has_usage_columns(cursor: Any) -> bool:
    """Whether `request_rows` has every column of USAGE_COLUMNS (a database written by an
    older version, read without migrating, may lack some: then every column is read)."""
    cursor.execute("SELECT * FROM request_rows WHERE 1 = 0")
    names = {d[0] for d in cursor.description}
    return all(column.strip() in names for column in USAGE_COLUMNS.split(","))


def view_key(by: str) -> ViewKey:
    """The key of one of `BY`'s views."""
    return lambda row, at: _key(row, by, at)


def shadow_report(db: Database, filters: Filters) -> list[dict[str, Any]]:
    """Shadow policies against the live ones over the period (`shadow_rollups`), per group
    and pair of policy versions: decisions, agreement rate, mean estimated differences of
    the shadow's primary from the live one (docs/policy-evaluation.md §3)."""
    where, params = _where(db, "at", filters.since, filters.until, filters, callers=False)
    sums: dict[tuple[str, str, str], list[float]] = {}
    try:
        with db.transaction() as cursor:
            cursor.execute(f"SELECT group_name, policy_version, shadow_version, decisions, "
                           f"agreements, cost_delta_usd, latency_delta_ms, "
                           f"error_rate_delta, dropped FROM shadow_rollups WHERE {where}",
                           params)
            found = cursor.fetchall()
    except Exception:  # a database no sidecar of this version migrated yet: no table
        return []
    for group, live, shadow, *figures in found:
        total = sums.setdefault((group, live, shadow), [0.0] * 6)
        for index, value in enumerate(figures):
            total[index] += value or 0
    rows = []
    for (group, live, shadow), (n, agree, cost, latency, errors, dropped) in sorted(
            sums.items()):
        rows.append({"group": group, "policy_version": live, "shadow_version": shadow,
                     "decisions": int(n), "agreement_rate": agree / n if n else None,
                     "mean_cost_delta_usd": cost / n if n else None,
                     "mean_latency_delta_ms": latency / n if n else None,
                     "mean_error_rate_delta": errors / n if n else None,
                     "dropped": int(dropped)})
    return rows


def _key(row: dict[str, Any], by: str, at: float | None = None) -> str:
    if by == "day":
        return row["day"] if "day" in row else day_of(at or 0.0)
    value = row.get(BY[by])
    return "" if value is None else str(value)


def _where(db: Database, time_column: str, since: object, until: object, filters: Filters,
           callers: bool) -> tuple[str, list[object]]:
    clauses = [f"{time_column} >= {{p}}", f"{time_column} < {{p}}"]
    params: list[object] = [since, until]
    if filters.group is not None:
        clauses.append("group_name = {p}")
        params.append(filters.group)
    if filters.caller is not None and callers:
        clauses.append("caller = {p}")
        params.append(filters.caller)
    return sql(" AND ".join(clauses), db), params


def _raw(cursor: Any, db: Database, table: str, time_column: str,
         filters: Filters, columns: str = "*") -> Iterator[dict[str, Any]]:
    where, params = _where(db, time_column, filters.since, filters.until, filters,
                           callers=table == "request_rows")
    reader = _streaming(cursor)
    try:
        reader.execute(f"SELECT {columns} FROM {table} WHERE {where}", params)
        names = [d[0] for d in reader.description]
        while batch := reader.fetchmany(_BATCH):
            for values in batch:
                yield dict(zip(names, values, strict=True))
    finally:
        if reader is not cursor:
            reader.close()


def _streaming(cursor: Any) -> Any:
    """A cursor that brings the rows as they are read. SQLite's does; psycopg's ordinary
    cursor transfers the whole result at `execute`, so on PostgreSQL a server-side cursor
    of the same transaction: memory is a batch, and a reader's time bound holds."""
    if type(cursor).__module__.startswith("psycopg"):
        return cursor.connection.cursor(name="sidecar_report_rows")
    return cursor


def _expired_days(cursor: Any, filters: Filters) -> list[str]:
    """Days overlapping the period whose raw rows are gone (read from rollups)."""
    cursor.execute("SELECT day FROM rollup_days WHERE raw_expired")
    return sorted(day for (day,) in cursor.fetchall()
                  if day_start(day) < filters.until and day_start(day) + DAY_S > filters.since)


def _rolled_up(cursor: Any, db: Database, filters: Filters, days: list[str]
               ) -> Iterator[tuple[str, str, str, str | None, Aggregate]]:
    if not days:
        return
    where, params = _where(db, "day", days[0], days[-1] + "~", filters, callers=True)
    wanted = set(days)
    cursor.execute(f"SELECT * FROM daily_usage WHERE {where}", params)
    names = [d[0] for d in cursor.description]
    parts: dict[tuple[str, ...], Aggregate] = {}
    for values in cursor.fetchall():
        row = dict(zip(names, values, strict=True))
        if row["day"] not in wanted:
            continue
        parts[_rollup_key(row)] = Aggregate(
            requests=row["requests"], errors=row["errors"], input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"], cached_tokens=row["cached_tokens"],
            cache_write_tokens=row["cache_write_tokens"],
            estimated_requests=row["estimated_requests"], cost_usd=row["cost_usd"],
            histogram=histogram_from_json(row["latency_histogram"]),
            error_classes=Counter(json.loads(row["error_classes"])))
    cursor.execute(f"SELECT * FROM daily_decisions WHERE {where}", params)
    names = [d[0] for d in cursor.description]
    for values in cursor.fetchall():
        row = dict(zip(names, values, strict=True))
        part = parts.get(_rollup_key(row))
        if part is not None:
            part.buckets[(row["dimension"], row["bucket"])] += row["requests"]
    for (day, group, caller, target), part in parts.items():
        yield day, group, caller, target, part


def _rollup_key(row: dict[str, Any]) -> tuple[str, ...]:
    return (row["day"], row["group_name"], row["caller"], row["serving_target"])


def _fallbacks(cursor: Any, db: Database, filters: Filters,
               expired: list[str]) -> list[dict[str, Any]]:
    counts = _fallback_counts(cursor, db, filters, expired, None)
    return [{"group": g, "from_target": f, "to_target": t, "failure": failure, "count": n}
            for (g, f, t, failure, _), n in sorted(counts.items())]


def fallback_views(db: Database, filters: Filters, step_s: int
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The fallbacks report and, from the same read, the transitions over time: per
    `step_s` bucket (its start, epoch seconds) and failure (the console's errors page)."""
    with db.transaction() as cursor:
        counts = _fallback_counts(cursor, db, filters, _expired_days(cursor, filters), step_s)
    report_rows: Counter[tuple[str, str, str, str]] = Counter()
    series: Counter[tuple[int, str]] = Counter()
    for (g, f, t, failure, at), n in counts.items():
        report_rows[(g, f, t, failure)] += n
        series[(at, failure)] += n
    return ([{"group": g, "from_target": f, "to_target": t, "failure": failure, "count": n}
             for (g, f, t, failure), n in sorted(report_rows.items())],
            [{"time": at, "failure": failure, "count": n}
             for (at, failure), n in sorted(series.items())])


def _fallback_counts(cursor: Any, db: Database, filters: Filters, expired: list[str],
                     step_s: int | None) -> Counter[tuple[str, str, str, str, int]]:
    def bucket(at: float) -> int:
        return 0 if step_s is None else int(at // step_s) * step_s

    counts: Counter[tuple[str, str, str, str, int]] = Counter(
        (r["group_name"], r["from_target"], r["to_target"], r["failure"], bucket(r["at"]))
        for r in _raw(cursor, db, "fallback_transitions", "at", filters))
    if expired:
        where, params = _where(db, "day", expired[0], expired[-1] + "~", filters,
                               callers=False)
        cursor.execute(f"SELECT * FROM daily_fallbacks WHERE {where}", params)
        names = [d[0] for d in cursor.description]
        for values in cursor.fetchall():
            row = dict(zip(names, values, strict=True))
            if row["day"] in expired:
                counts[(row["group_name"], row["from_target"], row["to_target"],
                        row["failure"], bucket(day_start(row["day"])))] += row["transitions"]
    return counts
