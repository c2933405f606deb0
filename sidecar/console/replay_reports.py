"""Replay reports on the console's Fallbacks and errors page: the JSON documents
`sidecar replay --format json --out DIR/NAME.json` wrote into the folder the sidecar was
given (`--replay-reports DIR`), newest first, each group's headline figures — what the
candidate would change, and its estimates against the logged ones (evaluation/replay.py's
document, read as JSON).

Bounded: at most `MAX_REPORTS` files (the newest by modification time), each read only if
it is a regular file of at most `MAX_BYTES`; a file that is not such a document is listed
as unreadable, never an error of the page. Read on the worker thread that renders the page.
"""

from __future__ import annotations

import json
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.console.html import moment, number, percent, table

MAX_REPORTS = 10
MAX_BYTES = 4 * 1024 * 1024
ESTIMATES = ("cost_usd", "latency_ms", "error_rate")


@dataclass(frozen=True)
class ReplayReport:
    name: str
    modified: float
    groups: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None


def read_reports(folder: Path | None) -> list[ReplayReport] | None:
    """The newest replay documents in `folder` (None: no folder was given)."""
    if folder is None:
        return None
    try:
        entries = [(entry, entry.stat()) for entry in folder.iterdir()
                   if entry.name.endswith(".json")]
    except OSError:
        return [ReplayReport(folder.name, 0.0, problem="the folder cannot be read")]
    entries.sort(key=lambda pair: pair[1].st_mtime, reverse=True)
    return [_read(path, info) for path, info in entries[:MAX_REPORTS]]


def _read(path: Path, info: Any) -> ReplayReport:
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
        return ReplayReport(path.name, info.st_mtime, problem="not a file of at most 4 MiB")
    try:
        document = json.loads(path.read_bytes())
        groups = document["groups"]
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return ReplayReport(path.name, info.st_mtime,
                            problem="not a `sidecar replay --format json` document")
    return ReplayReport(path.name, info.st_mtime, groups)


def render(reports: list[ReplayReport] | None) -> str:
    if reports is None:
        return ("<h2>Replay reports</h2><p class=\"note\">no folder of replay reports: start "
                "the sidecar with --replay-reports DIR and write reports there with "
                "<code>sidecar replay --format json --out DIR/NAME.json</code></p>")
    rows = []
    for report in reports:
        if report.problem is not None:
            rows.append([report.name, moment(report.modified) if report.modified else "–",
                         "–", "–", "–", "–", report.problem])
            continue
        for group in report.groups:
            rows.append([report.name, moment(report.modified), str(group.get("group", "?")),
                         number(_figure(group.get("evaluated"))),
                         percent(_figure(group.get("decisions_changed"))),
                         percent(_figure(group.get("candidate_mass_without_support"))),
                         _estimates(group.get("estimates"))])
    return ("<h2>Replay reports</h2>"
            + table(["report", "written", "group", "rows evaluated", "decisions changed",
                     "candidate mass without support", "estimates: logged → candidate (DR)"],
                    rows, caption=f"the newest {MAX_REPORTS} replay documents of the folder",
                    numeric_from=3))


def _figure(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _estimates(estimates: object) -> str:
    if not isinstance(estimates, dict):
        return "–"
    parts = []
    for name in ESTIMATES:
        estimate = estimates.get(name)
        if not isinstance(estimate, dict):
            continue
        logged = _figure((estimate.get("logged") or {}).get("value"))
        candidate = _figure((estimate.get("dr") or {}).get("value"))
        parts.append(f"{name} {_value(logged)} → {_value(candidate)}")
    return "; ".join(parts) or "–"


def _value(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"

