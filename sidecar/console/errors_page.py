"""The console's Fallbacks and errors page: fallback transitions and error classes over a
period (and over time), how each group's shadow policy disagreed with the live one, its
canaries and its shadow traffic: the decisions and fallbacks reports' parts
(console/telemetry_views.py); and the replay reports of the operator's folder
(console/replay_reports.py)."""

from __future__ import annotations

from typing import Any

from sidecar.console import replay_reports
from sidecar.console.html import clock, esc, number, percent, table, usd
from sidecar.console.replay_reports import ReplayReport
from sidecar.console.svg import bar_chart, line_chart
from sidecar.console.telemetry_views import Period
from sidecar.console.usage_page import period_form, series


def render(period: Period, found: dict[str, Any] | None, problem: str | None,
           groups: list[str], callers: list[str],
           replays: list[ReplayReport] | None = None) -> str:
    parts = ["<h1>Fallbacks and errors</h1>",
             period_form("/console/errors", period, groups, callers)]
    if problem is not None:
        parts.append(f'<p class="problem" role="alert">{esc(problem)}</p>')
    if found is not None and period.filters.caller is not None:
        parts.append('<p class="note">fallback transitions, shadow policies and shadow '
                     "traffic are not kept per caller: those parts show every caller</p>")
    if found is not None:
        parts += [_fallbacks(found), _errors(found), _shadow(found["shadow"]),
                  _canaries(found["canary"]), _mirrors(found["shadow_traffic"])]
    parts.append(replay_reports.render(replays))
    return "".join(parts)


def _fallbacks(found: dict[str, Any]) -> str:
    rows = found["fallbacks"]
    by_failure: dict[str, int] = {}
    for row in rows:
        by_failure[row["failure"]] = by_failure.get(row["failure"], 0) + row["count"]
    over_time = [(name, points) for name, points in
                 series([{"time": f"{r['time']}|{r['failure']}", "count": r["count"]}
                         for r in found["fallback_series"]], "time", "count")]
    return ("<h2>Fallback transitions</h2><div class=\"charts\">"
            + line_chart("fallback transitions over time, by failure", over_time,
                         span=found["span"], zero_step=found["step"])
            + bar_chart("fallback transitions by failure",
                        [(k, [float(v)]) for k, v in sorted(by_failure.items())], ["count"])
            + "</div>"
            + table(["group", "from", "to", "failure", "count"],
                    [[r["group"], r["from_target"], r["to_target"], r["failure"],
                      number(r["count"])] for r in rows],
                    caption="transitions (the fallbacks report)", numeric_from=4))


def _errors(found: dict[str, Any]) -> str:
    classes: dict[str, dict[str, int]] = {}
    for row in found["time"]:
        for name, count in row["error_classes"].items():
            classes.setdefault(name, {})[row["time"]] = count
    over_time = [(name, [(float(t), float(n)) for t, n in sorted(points.items())])
                 for name, points in sorted(classes.items())]
    rows = [[r["target"] or "(none)", number(r["requests"]), number(r["errors"]),
             percent(r["errors"] / r["requests"] if r["requests"] else None),
             ", ".join(f"{k} {v}" for k, v in r["error_classes"].items()) or "–"]
            for r in found["by_target"]]
    return ("<h2>Error classes</h2><div class=\"charts\">"
            + line_chart("requests that ended in error, by class", over_time,
                         span=found["span"], zero_step=found["step"])
            + "</div>"
            + table(["served by", "requests", "errors", "error rate", "error classes"], rows,
                    caption="errors by the target that served (the usage report)"))


def _shadow(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ("<h2>Shadow policies</h2>"
                '<p class="note">no shadow policy decided in this period</p>')
    headers = list(rows[0])
    return ("<h2>Shadow policies against the live ones</h2>"
            + table(headers, [[_cell(row[h]) for h in headers] for row in rows],
                    caption="shadow policies (the decisions report's shadow part)",
                    numeric_from=len(headers)))


def _canaries(canary: dict[str, list[dict[str, Any]]]) -> str:
    sides = canary.get("sides") or []
    events = canary.get("events") or []
    if not sides and not events:
        return "<h2>Canaries</h2><p class=\"note\">no canary served in this period</p>"
    return ("<h2>Canaries</h2>"
            + table(["group", "side", "policy version", "requests", "failed", "error rate",
                     "p95 latency", "mean cost"],
                    [[r["group"], r["side"], r["policy_version"], number(r["requests"]),
                      number(r["failed"]), percent(r["error_rate"]),
                      number(r["p95_latency_ms"], 0, " ms"), usd(r["mean_cost_usd"])]
                     for r in sides], caption="each side of each canary", numeric_from=3)
            + table(["at", "group", "candidate", "guard", "figure", "limit", "requests"],
                    [[clock(e["at"]), e["group_name"], e["canary_version"], e["guard"],
                      _cell(e["figure"]), _cell(e["guard_limit"]), number(e["requests"])]
                     for e in events], caption="withdrawals", numeric_from=4))


def _mirrors(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<h2>Shadow traffic</h2><p class=\"note\">nothing mirrored in this period</p>"
    headers = list(rows[0])
    return ("<h2>Shadow traffic</h2>"
            + table(headers, [[_cell(row[h]) for h in headers] for row in rows],
                    caption="mirrored candidates beside the live answers",
                    numeric_from=len(headers)))


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "–"
    return str(value)
