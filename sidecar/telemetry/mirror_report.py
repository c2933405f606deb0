"""The decisions report's shadow-traffic part (docs/rollout.md §4): per group and
candidate, the mirrored requests of the period beside their live answers — answer rates,
p95 latency and time to first byte, mean cost and tokens of each side, and the agreement
figures (both answered, output-length ratio, tool arguments and structured output that
parse). Read-only, bounded by the period like the other reports; `shadow_requests` is
never caller usage, so no usage or spend report reads it."""

from __future__ import annotations

from typing import Any

from sidecar.telemetry.aggregate import percentile
from sidecar.telemetry.database import Database, sql
from sidecar.telemetry.reports import Filters

_COLUMNS = ("group_name", "candidate", "shadow_error_class", "shadow_latency_ms",
            "shadow_ttft_ms", "shadow_output_tokens", "shadow_cost_usd",
            "shadow_tool_arguments_valid", "shadow_json_valid", "live_error_class",
            "live_status", "live_latency_ms", "live_ttfb_ms", "live_output_tokens",
            "live_cost_usd", "both_answered", "output_ratio", "same_finish", "same_tools")


def _rate(flags: list[object]) -> float | None:
    return sum(map(bool, flags)) / len(flags) if flags else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mirror_report(db: Database, filters: Filters) -> list[dict[str, Any]]:
    where = ["at >= {p}", "at < {p}"]
    params: list[object] = [filters.since, filters.until]
    if filters.group is not None:
        where.append("group_name = {p}")
        params.append(filters.group)
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        with db.transaction() as cursor:
            cursor.execute(sql(f"SELECT {', '.join(_COLUMNS)} FROM shadow_requests WHERE "
                               + " AND ".join(where), db), params)
            while batch := cursor.fetchmany(1000):
                for values in batch:
                    row = dict(zip(_COLUMNS, values, strict=True))
                    found.setdefault((row["group_name"], row["candidate"]), []).append(row)
    except Exception:  # a database no sidecar of this version migrated yet
        return []
    report = []
    for (group, candidate), rows in sorted(found.items()):
        def figures(key: str, subset: list[dict[str, Any]] = rows) -> list[float]:
            return [row[key] for row in subset if row[key] is not None]

        shadow_ok = [r for r in rows if r["shadow_error_class"] == "ok"]
        tools = figures("shadow_tool_arguments_valid")
        structured = figures("shadow_json_valid")
        report.append({
            "group": group, "candidate": candidate, "pairs": len(rows),
            "both_answered_rate": sum(bool(r["both_answered"]) for r in rows) / len(rows),
            "candidate_answered_rate": len(shadow_ok) / len(rows),
            "candidate_p95_latency_ms": percentile(figures("shadow_latency_ms", shadow_ok),
                                                   0.95),
            "live_p95_latency_ms": percentile(figures("live_latency_ms"), 0.95),
            "candidate_p95_ttft_ms": percentile(figures("shadow_ttft_ms", shadow_ok), 0.95),
            "live_p95_ttfb_ms": percentile(figures("live_ttfb_ms"), 0.95),
            "candidate_mean_cost_usd": _mean(figures("shadow_cost_usd")),
            "live_mean_cost_usd": _mean(figures("live_cost_usd")),
            "mean_output_ratio": _mean(figures("output_ratio")),
            "tool_arguments_valid_rate": sum(map(bool, tools)) / len(tools) if tools else None,
            "json_valid_rate": (sum(map(bool, structured)) / len(structured)
                                if structured else None),
            "same_finish_rate": _rate(figures("same_finish")),
            "same_tools_rate": _rate(figures("same_tools")),
        })
    return report
