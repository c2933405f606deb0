"""The console's Usage and cost page: the usage report (telemetry/reports.py) over a
period by target, caller and group, its series over time as charts, CSV export of every
view, and each caller's quotas and budgets against their limits (quotas/counters.py, as
admission counts them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.commands.report import csv_text
from sidecar.console.html import esc, link, number, options, percent, table, usd
from sidecar.console.svg import line_chart
from sidecar.console.telemetry_views import PERIODS, USAGE_VIEWS, Period
from sidecar.quotas.counters import QuotaCounters


@dataclass(frozen=True)
class QuotaRow:
    caller: str
    scope: str
    limit_name: str
    counted: float
    limit: float | None
    pressure: float


def quota_rows(counters: QuotaCounters, groups: list[str]) -> list[QuotaRow]:
    """On the event loop: every open quota window, counted (the fleet's last total plus this
    replica's since) against its limit, and the caller's budget pressure (the figure the
    `budget_pressure` score reads)."""
    rows = []
    for key, counter in counters.current():
        caller, scope, name, _ = key
        pressure = max((counters.spend_pressure(caller, g) for g in groups), default=0.0)
        rows.append(QuotaRow(caller, scope, name, counter.known + counter.unsynced,
                             counters.limit_of(key), pressure))
    return sorted(rows, key=lambda r: (r.caller, r.scope, r.limit_name))


def render(period: Period, views: dict[str, list[dict[str, Any]]] | None, problem: str | None,
           quotas: list[QuotaRow], groups: list[str], callers: list[str]) -> str:
    parts = ["<h1>Usage and cost</h1>", period_form("/console/usage", period, groups, callers)]
    if problem is not None:
        parts.append(f'<p class="problem" role="alert">{esc(problem)}</p>')
    if views is not None:
        parts.append(_charts(views, period))
        for view in USAGE_VIEWS:
            parts.append(_view_table(view, views[view], period))
    parts.append(_quotas(quotas))
    return "".join(parts)


def period_form(path: str, period: Period, groups: list[str], callers: list[str]) -> str:
    return (f'<form class="filters" method="get" action="{esc(path)}">'
            + options("period", "period", PERIODS, period.name, any_text=None)
            + options("group", "group", groups, period.filters.group)
            + options("caller", "caller", callers, period.filters.caller)
            + '<button type="submit">show</button></form>')


def series(rows: list[dict[str, Any]], key: str, column: str, label: str | None = None
           ) -> list[tuple[str, list[tuple[float, float]]]]:
    """Chart series from a time view's rows (`start` or `start|name` keys); a series of
    rows without a name is called `label` (the column's name by default)."""
    named: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        start, separator, name = str(row[key]).partition("|")
        value = row.get(column)
        if value is not None:
            name = name or ("(no target)" if separator else label or column)
            named.setdefault(name, []).append((float(start), value))
    return sorted(named.items())


def _charts(views: dict[str, list[dict[str, Any]]], period: Period) -> str:
    step = f"per {period.step_s // 60} min" if period.step_s < 3600 else \
        f"per {period.step_s // 3600} h"
    span = period.span
    return ('<div class="charts">'
            + line_chart(f"requests {step}, by the target that served",
                         series(views["time_target"], "time_target", "requests"), span=span,
                         zero_step=period.step_s)
            + line_chart(f"cost {step} (USD)",
                         series(views["time"], "time", "cost_usd", "cost (USD)"),
                         span=span, zero_step=period.step_s)
            + line_chart(f"latency p95 {step}",
                         series(views["time"], "time", "latency_p95_ms", "p95 latency"),
                         unit=" ms", span=span)
            + line_chart(f"errors {step}",
                         series(views["time"], "time", "errors", "requests with an error class"),
                         span=span, zero_step=period.step_s)
            + "</div>")


def _view_table(view: str, rows: list[dict[str, Any]], period: Period) -> str:
    cells = []
    for row in rows:
        requests = row["requests"] or 0
        cells.append([row[view] or "(none)", number(requests), number(row["errors"]),
                      percent(row["errors"] / requests if requests else None),
                      number(row["input_tokens"]), number(row["output_tokens"]),
                      number(row["cached_tokens"]), usd(row["cost_usd"]),
                      usd(row["cost_usd"] / requests if requests else None),
                      number(row["latency_p50_ms"], 0, " ms"),
                      number(row["latency_p95_ms"], 0, " ms"),
                      number(row["latency_p99_ms"], 0, " ms"),
                      ", ".join(f"{k} {v}" for k, v in row["error_classes"].items()) or "–"])
    csv_link = link("/console/usage.csv", f"CSV of this table (by {view})", view=view,
                    period=period.name, group=period.filters.group,
                    caller=period.filters.caller)
    return (f"<h2>By {esc(view)}</h2>"
            + table([view, "requests", "errors", "error rate", "input tokens",
                     "output tokens", "cached tokens", "cost", "cost/request", "p50", "p95",
                     "p99", "error classes"], cells, caption=f"usage by {view}",
                    css="usage")
            + f'<p class="export">{csv_link}</p>')


def _quotas(rows: list[QuotaRow]) -> str:
    cells = [[r.caller, r.scope, r.limit_name, number(r.counted, 4 if "usd" in r.limit_name else 0),
              number(r.limit, 2 if r.limit is not None and "usd" in r.limit_name else 0),
              percent(r.counted / r.limit if r.limit else None), percent(r.pressure, 0)]
             for r in rows]
    return ("<h2>Quotas and budgets</h2>"
            + table(["caller", "scope", "limit", "counted", "limit value", "used",
                     "budget pressure"], cells, caption="callers' open quota windows",
                    numeric_from=3))


def usage_csv(rows: list[dict[str, Any]]) -> bytes:
    """The view's rows as `sidecar report usage --format csv` prints them."""
    return (csv_text(rows) + "\n").encode()
