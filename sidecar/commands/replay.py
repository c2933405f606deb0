"""`sidecar replay`: a candidate configuration's decisions over a logged window, estimated
from the logged outcomes (docs/policy-evaluation.md §2). Prints a table or JSON, or writes
a self-contained HTML page; a progress bar on standard error for long replays."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from sidecar.commands.text_table import format_table
from sidecar.config.models import SidecarConfig
from sidecar.config.service_settings import Telemetry
from sidecar.evaluation.logged import read_log, read_mirrors
from sidecar.evaluation.replay import FIGURES, GroupReplay, replay
from sidecar.evaluation.report_html import html_page
from sidecar.telemetry.database import open_database
from sidecar.telemetry.reports import parse_since

_BAR = 30


class ProgressBar:
    """`[#####.....]  1,234 / 5,678 rows` on one line of `stream`, redrawn at most 10 times
    a second and once at the end."""

    def __init__(self, stream: TextIO, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self._stream = stream
        self._clock = clock
        self._drawn = -math.inf

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if done < total and now - self._drawn < 0.1:
            return
        self._drawn = now
        filled = _BAR if total == 0 else _BAR * done // total
        self._stream.write(f"\r[{'#' * filled}{'.' * (_BAR - filled)}] "
                           f"{done:,} / {total:,} rows")
        if done >= total:
            self._stream.write("\n")
        self._stream.flush()


def run_replay(candidate: SidecarConfig, settings: Telemetry, since: str, until: str | None,
               group: str | None, output: str, confidence: float = 0.95,
               progress: ProgressBar | None = None, now: float | None = None) -> str:
    moment = time.time() if now is None else now
    start = parse_since(since, moment)
    end = parse_since(until, moment) if until else moment + 1
    # One retention window before the period feeds the observations, every group's (the
    # live store is shared by target), so the period's first decisions are not made cold.
    warm_up = candidate.observation_retention_seconds
    db = open_database(settings, read_only=True)
    db.open()
    try:
        decisions, attempts = read_log(db, start - warm_up, end)
        mirrors = read_mirrors(db, start, end, group)
    finally:
        db.close()
    reports = replay(candidate, decisions, attempts, confidence, progress, since=start,
                     group=group, mirrors=mirrors)
    document = {"since": start, "until": end, "confidence": confidence,
                "groups": [r.to_dict() for r in reports]}
    if output == "json":
        return json.dumps(document, indent=2, allow_nan=False)
    if output == "html":
        return html_page(document)
    return as_table(reports, confidence) if reports else "no logged requests in that period"


def as_table(reports: Sequence[GroupReplay], confidence: float) -> str:
    blocks = []
    for r in reports:
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(r.not_evaluated.items()))
        lines = [f"group {r.group}: {r.evaluated:,} of {r.rows:,} logged requests evaluated"
                 + (f"; not evaluated: {skipped}" if skipped else "")]
        if r.candidate_version is not None:
            logged = ", ".join(f"{v} ({n})" for v, n in r.logged_versions.most_common())
            lines.append(f"policy: logged {logged or '-'}; candidate {r.candidate_version}")
        if r.evaluated:
            lines.append(f"decisions that change: {r.changed:.1%}"
                         + (f"; affinity churn: {r.churn:.1%} of {r.pinned:,} pinned turns"
                            if r.churn is not None else ""))
            if r.unlogged_mass > 0.001:
                lines.append(f"candidate probability on targets never logged: "
                             f"{r.unlogged_mass:.1%} (no doubly robust estimate; IPS and "
                             "SNIPS leave it out)")
            if r.unsupported_mass > 0.001:
                lines.append(f"candidate probability the logging policy gave 0 for those "
                             f"requests: {r.unsupported_mass:.1%} (IPS and SNIPS cannot see "
                             "it; DR models it from other requests)")
            if r.shadow_supported_mass > 0.001:
                lines.append(f"of it, answered by shadow traffic: "
                             f"{r.shadow_supported_mass:.1%}")
            for name, (n, expected, logged_mean) in r.paired.items():
                lines.append(f"{name} on {n:,} mirrored requests every target of the "
                             f"candidate answered: candidate {_value(name, expected)}, "
                             f"logged {_value(name, logged_mean)} (shadow traffic, no "
                             "estimator)")
            rows = [["figure", "n", "logged", "candidate (DR)", f"{confidence:.0%} interval",
                     "difference", "IPS", "SNIPS", "effective n"]]
            for name in FIGURES:
                e = r.estimates.get(name)
                if e is None:
                    continue
                rows.append([name, f"{e.n:,}", _value(name, e.logged.value),
                             _value(name, e.dr.value),
                             f"{_value(name, e.dr.low)} .. {_value(name, e.dr.high)}",
                             f"{_signed(name, e.delta.value)} ({_signed(name, e.delta.low)}"
                             f" .. {_signed(name, e.delta.high)})",
                             _value(name, e.ips.value), _value(name, e.snips.value),
                             f"{e.effective_n:,.0f}"])
            lines += ["", format_table(rows), ""]
            shares = [["target", "logged share", "candidate share"]]
            for target in sorted(set(r.logged_shares) | set(r.candidate_shares)):
                shares.append([target, f"{r.logged_shares.get(target, 0):.1%}",
                               f"{r.candidate_shares.get(target, 0):.1%}"])
            lines.append(format_table(shares))
        if r.features_never_logged:
            lines.append("prompt features the candidate looks for that no logged request had "
                         f"(absent, or not looked for then): {', '.join(r.features_never_logged)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _value(name: str, value: float) -> str:
    if not math.isfinite(value):
        return "-"
    if name == "cost_usd":
        return f"${value:.6f}"
    if name == "latency_ms":
        return f"{value:,.0f} ms"
    return f"{value:.2%}"


def _signed(name: str, value: float) -> str:
    text = _value(name, abs(value))
    return text if text == "-" else ("+" if value >= 0 else "−") + text


def progress_for(requested: bool | None, stream: TextIO = sys.stderr) -> ProgressBar | None:
    """A bar when asked for, or by default when standard error is a terminal."""
    if requested is None:
        requested = stream.isatty()
    return ProgressBar(stream) if requested else None
