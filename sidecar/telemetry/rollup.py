"""Daily rollups and raw-row retention (docs/telemetry.md §5).

A finished UTC day (ended at least `GRACE_S` ago, so late rows have landed) is aggregated
into normalized daily rows: `daily_usage` (sums, error classes, a latency histogram),
`daily_decisions` (one row per dimension and bucket) and `daily_fallbacks`, keyed by day,
group, caller and serving target. `rollup_days` records what was rolled. When a rolled day
falls out of `raw_retention_days`, it is rolled again from the raw rows (so rows that
arrived after the first rollup count) and its raw rows are deleted in the same transaction;
from then on reports read that day from the rollups.

Each day is one transaction. On PostgreSQL a replica that finds another one rolling up skips
(advisory lock). `maintain` runs on the telemetry writer's thread on a schedule and from
`sidecar rollup`; it does at most `MAX_DAYS_PER_RUN` days per run, so a first run over a
long history is spread over several runs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sidecar.telemetry.aggregate import DAY_S, Aggregate, day_of, day_start
from sidecar.telemetry.database import Database, sql
from sidecar.telemetry.schema import ROLLUP_LOCK, ROLLUP_TABLES

GRACE_S = 3600
MAX_DAYS_PER_RUN = 62
FETCH_ROWS = 1000
RollupKey = tuple[str, str, str, str]  # day, group, caller, serving target


@dataclass
class Maintenance:
    rolled_up: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    raw_rows_deleted: int = 0
    skipped_locked: bool = False

    def __str__(self) -> str:
        """What the run did, for the log line: `rolled up 1 day (2026-01-01), expired 0
        days, deleted 0 raw rows`."""
        rows = self.raw_rows_deleted
        text = (f"rolled up {_days(self.rolled_up)}, expired {_days(self.expired)}, "
                f"deleted {rows} raw row{'' if rows == 1 else 's'}")
        if self.skipped_locked:
            text += "; another replica is rolling up, the rest is left to it"
        return text


def _days(days: list[str]) -> str:
    """`0 days`, `1 day (2026-01-01)`, `3 days (2026-01-01 to 2026-01-03)`."""
    if not days:
        return "0 days"
    if len(days) == 1:
        return f"1 day ({days[0]})"
    return f"{len(days)} days ({min(days)} to {max(days)})"


def maintain(db: Database, now: float, retention_days: int) -> Maintenance:
    """Roll up each finished day not rolled yet; a day past retention is rolled (again) and
    its raw rows deleted."""
    done = Maintenance()
    with db.transaction() as cursor:
        rolled = dict(cursor.execute("SELECT day, raw_expired FROM rollup_days").fetchall())
    horizon = now - retention_days * DAY_S
    budget = MAX_DAYS_PER_RUN
    day = _next_day_with_rows(db, 0.0)
    while day is not None and day_start(day) + DAY_S + GRACE_S <= now and budget > 0:
        past = day_start(day) + DAY_S <= horizon
        if day not in rolled or (past and not rolled[day]):
            if not _locked_day(db, day, now, expire=past, done=done):
                return done
            budget -= 1
        day = _next_day_with_rows(db, day_start(day) + DAY_S)
    return done


def _next_day_with_rows(db: Database, since: float) -> str | None:
    """The first day at or after `since` that holds raw rows (two indexed lookups)."""
    with db.transaction() as cursor:
        cursor.execute(sql("SELECT MIN(started_at) FROM request_rows WHERE started_at >= {p}",
                           db), (since,))
        first_request = cursor.fetchone()[0]
        cursor.execute(sql("SELECT MIN(at) FROM fallback_transitions WHERE at >= {p}", db),
                       (since,))
        first_fallback = cursor.fetchone()[0]
    firsts = [t for t in (first_request, first_fallback) if t is not None]
    return day_of(min(firsts)) if firsts else None


def _locked_day(db: Database, day: str, now: float, expire: bool, done: Maintenance) -> bool:
    with db.try_transaction(ROLLUP_LOCK) as cursor:
        if cursor is None:
            done.skipped_locked = True
            return False
        cursor.execute(sql("SELECT raw_expired FROM rollup_days WHERE day = {p}", db), (day,))
        state = cursor.fetchone()
        if state is not None and (state[0] or not expire):
            return True  # another replica did it meanwhile
        roll_day(cursor, db, day)
        if expire:
            done.raw_rows_deleted += _delete_raw(cursor, db, day)
            done.expired.append(day)
        else:
            done.rolled_up.append(day)
        cursor.execute(sql("DELETE FROM rollup_days WHERE day = {p}", db), (day,))
        cursor.execute(sql("INSERT INTO rollup_days (day, rolled_at, raw_expired) "
                           "VALUES ({p}, {p}, {p})", db), (day, now, expire))
    return True


def roll_day(cursor: Any, db: Database, day: str) -> None:
    """Replace the day's rollup rows with an aggregate of its raw rows."""
    start, end = day_start(day), day_start(day) + DAY_S
    for table in ROLLUP_TABLES:
        cursor.execute(sql(f"DELETE FROM {table} WHERE day = {{p}}", db), (day,))
    totals: dict[RollupKey, Aggregate] = {}
    for row in _fetch(cursor, sql("SELECT * FROM request_rows WHERE started_at >= {p} "
                                  "AND started_at < {p}", db), (start, end)):
        key = (day, row["group_name"], row["caller"], row["serving_target"] or "")
        totals.setdefault(key, Aggregate()).add_row(row, exact=False)
    cursor.executemany(sql(
        "INSERT INTO daily_usage (day, group_name, caller, serving_target, requests, errors, "
        "input_tokens, output_tokens, cached_tokens, cache_write_tokens, estimated_requests, "
        "cost_usd, latency_histogram, error_classes) "
        "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
        db), [(*key, t.requests, t.errors, t.input_tokens, t.output_tokens, t.cached_tokens,
               t.cache_write_tokens, t.estimated_requests, t.cost_usd, t.histogram_json(),
               json.dumps(dict(sorted(t.error_classes.items()))))
              for key, t in sorted(totals.items())])
    cursor.executemany(sql(
        "INSERT INTO daily_decisions (day, group_name, caller, serving_target, dimension, "
        "bucket, requests) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})", db),
        [(*key, dimension, bucket, n) for key, t in sorted(totals.items())
         for (dimension, bucket), n in sorted(t.buckets.items())])
    transitions: Counter[tuple[str, ...]] = Counter(
        (day, row["group_name"], row["from_target"], row["to_target"], row["failure"])
        for row in _fetch(cursor, sql("SELECT * FROM fallback_transitions WHERE at >= {p} "
                                      "AND at < {p}", db), (start, end)))
    cursor.executemany(sql(
        "INSERT INTO daily_fallbacks (day, group_name, from_target, to_target, failure, "
        "transitions) VALUES ({p}, {p}, {p}, {p}, {p}, {p})", db),
        [(*key, n) for key, n in sorted(transitions.items())])


def _delete_raw(cursor: Any, db: Database, day: str) -> int:
    start, end = day_start(day), day_start(day) + DAY_S
    cursor.execute(sql("DELETE FROM request_rows WHERE started_at >= {p} AND started_at < {p}",
                       db), (start, end))
    deleted = max(0, cursor.rowcount)
    cursor.execute(sql("DELETE FROM fallback_transitions WHERE at >= {p} AND at < {p}", db),
                   (start, end))
    deleted += max(0, cursor.rowcount)
    # (canary_events are kept: a withdrawal must outlive retention, rollout/canary_guard.py)
    for table in ("shadow_rollups", "shadow_requests"):
        cursor.execute(sql(f"DELETE FROM {table} WHERE at >= {{p}} AND at < {{p}}", db),
                       (start, end))
        deleted += max(0, cursor.rowcount)
    return deleted


def _fetch(cursor: Any, statement: str, params: tuple[object, ...]) -> Iterator[dict]:
    """Rows as dicts, a batch at a time (a day may hold millions)."""
    cursor.execute(statement, params)
    names = [d[0] for d in cursor.description]
    while batch := cursor.fetchmany(FETCH_ROWS):
        for values in batch:
            yield dict(zip(names, values, strict=True))
