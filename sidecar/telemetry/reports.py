"""Reports over the telemetry rows: usage, decisions and fallbacks (docs/telemetry.md §4).

Read-only queries on a DB-API connection, grouped in Python so one code path serves SQLite
and PostgreSQL alike (parameters are bound, never formatted in). Percentiles are exact over
raw rows. Every value is a configuration name, bucket name or number, like the rows.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

KINDS = ("usage", "decisions", "fallbacks")
BY = {"target": "serving_target", "caller": "caller", "group": "group_name", "day": "day"}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The decision buckets a decisions report counts, by column.
DECISION_DIMENSIONS = ("strategy", "cold_start", "complexity", "affinity", "probe",
                       "final_share_bucket", "term_value_bucket", "max_tokens_filtered",
                       "max_tokens_bucket", "input_size_bucket", "admission", "join_kind")


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


def _rows(conn: Any, table: str, time_column: str, filters: Filters, placeholder: str,
          columns: str = "*") -> list[dict[str, Any]]:
    where = [f"{time_column} >= {placeholder}", f"{time_column} < {placeholder}"]
    params: list[object] = [filters.since, filters.until]
    if filters.group is not None:
        where.append(f"group_name = {placeholder}")
        params.append(filters.group)
    if filters.caller is not None and table == "request_rows":
        where.append(f"caller = {placeholder}")
        params.append(filters.caller)
    cursor = conn.execute(f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)}",
                          params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _day(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


def _key(row: dict[str, Any], by: str) -> str:
    if by == "day":
        return _day(row["started_at"] if "started_at" in row else row["at"])
    value = row.get(BY[by])
    return "" if value is None else str(value)


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest rank, as the observation windows report it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _grouped(rows: Iterable[dict[str, Any]], by: str) -> list[tuple[str, list[dict]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[_key(row, by)].append(row)
    return sorted(groups.items())


def usage(rows: Iterable[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    report = []
    for key, members in _grouped(rows, by):
        latencies = [r["latency_ms"] for r in members if r["latency_ms"] is not None]
        errors = Counter(r["error_class"] for r in members
                         if r["error_class"] not in (None, "ok"))
        report.append({
            by: key,
            "requests": len(members),
            "errors": sum(errors.values()),
            "input_tokens": sum(r["input_tokens"] or 0 for r in members),
            "output_tokens": sum(r["output_tokens"] or 0 for r in members),
            "cached_tokens": sum(r["cached_tokens"] or 0 for r in members),
            "cost_usd": round(sum(r["cost_usd"] or 0.0 for r in members), 6),
            "latency_p50_ms": percentile(latencies, 0.50),
            "latency_p95_ms": percentile(latencies, 0.95),
            "latency_p99_ms": percentile(latencies, 0.99),
            "error_classes": dict(sorted(errors.items())),
        })
    return report


def decisions(rows: Iterable[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Per key: counts of each decision bucket, and of each exclusion stage."""
    report = []
    for key, members in _grouped(rows, by):
        entry: dict[str, Any] = {by: key, "requests": len(members)}
        for dimension in DECISION_DIMENSIONS:
            counts = Counter(_text(dimension, r[dimension]) for r in members)
            entry[dimension] = dict(sorted(counts.items()))
        stages = Counter(pair.split(":", 1)[1] for r in members
                         for pair in (r["exclusions"] or "").split(",") if ":" in pair)
        entry["exclusion_stages"] = dict(sorted(stages.items()))
        signals = Counter(name for r in members for name in (r["signals"] or "").split(",")
                          if name)
        entry["signals"] = dict(sorted(signals.items()))
        report.append(entry)
    return report


def fallbacks(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    counts = Counter((r["group_name"], r["from_target"], r["to_target"], r["failure"])
                     for r in rows)
    return [{"group": g, "from_target": f, "to_target": t, "failure": failure, "count": n}
            for (g, f, t, failure), n in sorted(counts.items())]


def report(conn: Any, kind: str, filters: Filters, by: str = "target",
           placeholder: str = "?") -> list[dict[str, Any]]:
    if kind not in KINDS:
        raise ValueError(f"unknown report {kind!r} (one of: {', '.join(KINDS)})")
    if by not in BY:
        raise ValueError(f"--by {by!r}: one of {', '.join(BY)}")
    if kind == "fallbacks":
        return fallbacks(_rows(conn, "fallback_transitions", "at", filters, placeholder))
    rows = _rows(conn, "request_rows", "started_at", filters, placeholder)
    return usage(rows, by) if kind == "usage" else decisions(rows, by)


def _text(dimension: str, value: object) -> str:
    if dimension == "max_tokens_filtered":  # a boolean (SQLite stores 0/1)
        return "yes" if value else "no"
    return "none" if value is None else str(value)
