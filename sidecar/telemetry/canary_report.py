"""The decisions report's canary part (docs/rollout.md): per group, each side's requests
over the period — by the `canary` column of `request_rows` — and the withdrawals
(`canary_events`). Read-only, bounded by the period like the other reports."""

from __future__ import annotations

from typing import Any

from sidecar.observe.records import request_failed
from sidecar.telemetry.aggregate import percentile
from sidecar.telemetry.database import Database, sql
from sidecar.telemetry.reports import Filters


def canary_report(db: Database, filters: Filters) -> dict[str, list[dict[str, Any]]]:
    """`sides`: per group, side and policy version, requests, failed ones, p95 latency and
    mean cost; `events`: each withdrawal. Empty on a database not yet migrated."""
    where = ["started_at >= {p}", "started_at < {p}", "canary IS NOT NULL"]
    params: list[object] = [filters.since, filters.until]
    if filters.group is not None:
        where.append("group_name = {p}")
        params.append(filters.group)
    if filters.caller is not None:
        where.append("caller = {p}")
        params.append(filters.caller)
    sides: dict[tuple[str, str, str], list[Any]] = {}
    try:
        with db.transaction() as cursor:
            cursor.execute(sql("SELECT group_name, canary, policy_version, status, "
                               "error_class, latency_ms, cost_usd FROM request_rows WHERE "
                               + " AND ".join(where), db), params)
            while batch := cursor.fetchmany(1000):
                for group, side, version, status, error, latency, cost in batch:
                    total = sides.setdefault((group, side, version or ""), [0, 0, [], 0.0, 0])
                    total[0] += 1
                    failed = request_failed(status, error)
                    total[1] += failed
                    if not failed and latency is not None:
                        total[2].append(latency)
                    if cost is not None:
                        total[3] += cost
                        total[4] += 1
            event_where = ["at >= {p}", "at < {p}"]
            event_params: list[object] = [filters.since, filters.until]
            if filters.group is not None:
                event_where.append("group_name = {p}")
                event_params.append(filters.group)
            cursor.execute(sql("SELECT at, replica, group_name, policy_version, "
                               "canary_version, event, guard, figure, guard_limit, requests, "
                               "errors FROM canary_events WHERE " + " AND ".join(event_where)
                               + " ORDER BY at", db), event_params)
            names = [d[0] for d in cursor.description]
            events = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    except Exception:  # a database no sidecar of this version migrated yet
        return {"sides": [], "events": []}
    rows = [{"group": group, "side": side, "policy_version": version, "requests": n,
             "failed": failed, "error_rate": failed / n,
             "p95_latency_ms": percentile(latencies, 0.95),
             "mean_cost_usd": cost / priced if priced else None}
            for (group, side, version), (n, failed, latencies, cost, priced)
            in sorted(sides.items())]
    return {"sides": rows, "events": events}


def recorded_withdrawals(db: Database, candidates: dict[str, str]) -> set[tuple[str, str]]:
    """Which of `candidates` (group → candidate version) a `canary_events` row says were
    withdrawn — by this replica before a restart, or by another sharing the database."""
    if not candidates:
        return set()
    versions = sorted(set(candidates.values()))
    marks = ", ".join(["{p}"] * len(versions))
    with db.transaction() as cursor:
        cursor.execute(sql("SELECT DISTINCT group_name, canary_version FROM canary_events "
                           f"WHERE event = 'withdrawn' AND canary_version IN ({marks})", db),
                       versions)
        found = {(group, version) for group, version in cursor.fetchall()}
    return {(group, version) for group, version in candidates.items()
            if (group, version) in found}
