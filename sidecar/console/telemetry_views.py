"""What the console's usage and errors pages read from the telemetry database, by the code
`sidecar report` runs (telemetry/reports.py and its canary, shadow and mirror parts), so a
figure on a page is the report's figure.

Bounded: the period is one of `PERIODS` (at most 7 days); the read of the period's
request rows stops after `MAX_READ_SECONDS` (ReportTooLong: the page says so and names
the CLI); the errors page's other parts read the smaller tables (fallback transitions,
canary events, shadow rows) and the canary rows of the period, unbounded in time but by
the period; the series have at most about 30 points. Runs on a worker thread with a
read-only connection (console/app.py), never on the event loop. On PostgreSQL the rows
come through a server-side cursor (telemetry/reports.py `_streaming`), so the bound holds
there too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sidecar.telemetry.canary_report import canary_report
from sidecar.telemetry.database import Database
from sidecar.telemetry.mirror_report import mirror_report
from sidecar.telemetry.reports import (
    Filters,
    fallback_views,
    report_views,
    shadow_report,
    view_key,
)

# period → (seconds, series step in seconds): about 15 to 30 points a chart.
PERIODS = {"15m": (900, 60), "1h": (3600, 120), "6h": (21_600, 900),
           "24h": (86_400, 3600), "7d": (604_800, 21_600)}
DEFAULT_PERIOD = "1h"
MAX_READ_SECONDS = 10.0
USAGE_VIEWS = ("target", "caller", "group", "complexity")


@dataclass(frozen=True)
class Period:
    name: str
    filters: Filters
    step_s: int

    @property
    def span(self) -> tuple[float, float]:
        """The time axis of the period's charts: its first bucket to now."""
        return (float(int(self.filters.since // self.step_s) * self.step_s),
                self.filters.until - 1)

    @classmethod
    def of(cls, name: str | None, group: str | None, caller: str | None,
           now: float) -> Period:
        name = name if name in PERIODS else DEFAULT_PERIOD
        seconds, step = PERIODS[name]  # type: ignore[index]
        return cls(name, Filters(now - seconds, now + 1, group, caller), step)  # type: ignore[arg-type]


def bucket_key(step_s: int, then: str = "") -> Any:
    """A view keyed by the start of the row's `step_s` bucket (and its `then` column)."""
    def key(row: dict[str, Any], at: float) -> str:
        start = str(int(at // step_s) * step_s)
        return start if not then else f"{start}|{row.get(then) or ''}"
    return key


def complexity_key(row: dict[str, Any], at: float) -> str:
    """The row's complexity bucket (what the request was judged), for what a simple and a
    complex request cost; days read from rollups have none (`rolled up`)."""
    if "day" in row:
        return "rolled up"
    return str(row.get("complexity") or "none")


def usage(db: Database, period: Period) -> dict[str, list[dict[str, Any]]]:
    """The usage report by target, caller, group and complexity, and over time (in total and by the
    target that served), from one read of the period."""
    views = {name: view_key(name) for name in ("target", "caller", "group")}
    views["complexity"] = complexity_key
    views["time"] = bucket_key(period.step_s)
    views["time_target"] = bucket_key(period.step_s, "serving_target")
    return report_views(db, "usage", period.filters, views, max_seconds=MAX_READ_SECONDS)


def errors(db: Database, period: Period) -> dict[str, Any]:
    """Fallback transitions (and over time), error classes by target and over time, the
    shadow policies' rollups, canaries and shadow traffic."""
    started = time.monotonic()
    transitions, transition_series = fallback_views(db, period.filters, period.step_s)
    left = max(1.0, MAX_READ_SECONDS - (time.monotonic() - started))
    views = report_views(db, "usage", period.filters,
                         {"target": view_key("target"), "time": bucket_key(period.step_s)},
                         max_seconds=left)
    return {"span": period.span, "step": period.step_s, "fallbacks": transitions,
            "fallback_series": transition_series,
            "by_target": views["target"], "time": views["time"],
            "shadow": shadow_report(db, period.filters),
            "canary": canary_report(db, period.filters),
            "shadow_traffic": mirror_report(db, period.filters)}
