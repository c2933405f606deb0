"""Figures of a simulated run and the family's report: per seed against `weighted`, then
the median and the worst decile over the seeds, each against its goal (issue #31).

Definitions (the sick target's drain and return are drift_report.py's):
- simple cost: mean cost of the served `simple` requests; saving = 1 − dynamic / weighted;
- complex on validated: the share of requests the router rated `complex` whose primary and
  serving target are validated;
- stickiness: follow-up turns whose primary is the previous turn's, among those whose
  previous primary was still a candidate (a pin must move off an excluded target: SPEC);
- client errors: requests that failed every attempt.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from drift_report import Attempt, drift
from family_sim import Run, phases
from family_workloads import AGENT, CHAT, SIMPLE


@dataclass(frozen=True)
class Figures:
    window: int
    simple_cost: float
    complex_validated: float | None
    stickiness: float | None
    errors: int
    requests: int
    p95_s: float
    drain_s: float | None
    after_drain: float | None
    half_share_s: float | None


def figures(run: Run) -> Figures:
    results = run.results
    simple = [r.cost for r in results if r.kind == SIMPLE and not r.error]
    validated = {slot for slot, profile, _ in run.member.targets if profile.validated}
    complex_ = [r for r in results if r.complexity == "complex" and not r.error]
    follow = [r for r in results if r.kind in (CHAT, AGENT) and r.turn > 0 and not r.forced
              and r.primary is not None]
    previous = {(r.ident, r.turn): r.primary for r in results}
    kept = [previous.get((r.ident, r.turn - 1)) == r.primary for r in follow
            if previous.get((r.ident, r.turn - 1)) is not None]
    latencies = sorted(r.latency for r in results)
    starts, total = phases(run.window)
    d = drift([Attempt(at, slot) for at, slot in run.attempts], starts, total,
              run.member.sick)
    return Figures(
        window=run.window, simple_cost=statistics.fmean(simple) if simple else float("nan"),
        complex_validated=(sum(r.primary in validated and r.serving in validated
                               for r in complex_) / len(complex_)) if complex_ else None,
        stickiness=sum(kept) / len(kept) if kept else None,
        errors=sum(r.error for r in results), requests=len(results),
        p95_s=latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan"),
        drain_s=d.drain_s, after_drain=d.after_drain, half_share_s=d.half_share_s)


@dataclass(frozen=True)
class Goal:
    name: str
    better: str          # "high" or "low"
    median: float        # the goal for the median
    worst: float         # the goal for the worst decile
    unit: str


GOALS = (
    Goal("simple-request saving vs weighted", "high", 0.30, 0.15, "%"),
    Goal("complex on validated", "high", 1.0, 1.0, "%"),
    Goal("time to drain (windows)", "low", 1.0, 1.0, "w"),
    Goal("sick share after drain", "low", 0.01, 0.01, "%"),
    Goal("back to half share (windows)", "low", 1.0, 1.0, "w"),
    Goal("stickiness", "high", 0.99, 0.99, "%"),
    Goal("client errors minus weighted's", "low", 0, 0, "n"),
)


def per_seed(weighted: Figures, dynamic: Figures) -> dict[str, float]:
    """Each goal's figure for one seed (a drain that never happened counts as the whole
    degrade phase; a return that never happened as the whole recovery)."""
    starts, total = phases(dynamic.window)
    degrade = starts["recover"] - starts["degrade"]
    recover = total - starts["recover"]
    return {
        "simple-request saving vs weighted": 1 - dynamic.simple_cost / weighted.simple_cost,
        "complex on validated": (1.0 if dynamic.complex_validated is None
                                 else dynamic.complex_validated),
        "time to drain (windows)": (degrade if dynamic.drain_s is None
                                    else dynamic.drain_s) / dynamic.window,
        "sick share after drain": 1.0 if dynamic.after_drain is None else dynamic.after_drain,
        "back to half share (windows)": (recover if dynamic.half_share_s is None
                                         else dynamic.half_share_s) / dynamic.window,
        "stickiness": 1.0 if dynamic.stickiness is None else dynamic.stickiness,
        "client errors minus weighted's": dynamic.errors - weighted.errors,
    }


def worst_decile(values: Sequence[float], better: str) -> float:
    """The value a tenth of the seeds do worse than (nearest rank)."""
    ordered = sorted(values, reverse=better == "low")
    return ordered[max(0, (len(ordered) - 1) // 10)]


def summary(rows: list[dict[str, float]]) -> list[tuple[Goal, float, float, bool]]:
    """(goal, median, worst decile, met) for each goal."""
    out = []
    for goal in GOALS:
        values = [row[goal.name] for row in rows]
        median = statistics.median(values)
        worst = worst_decile(values, goal.better)
        met = ((median >= goal.median and worst >= goal.worst) if goal.better == "high"
               else (median <= goal.median and worst <= goal.worst))
        out.append((goal, median, worst, met))
    return out


def show(value: float, unit: str) -> str:
    if unit == "%":
        return f"{100 * value:.1f} %"
    if unit == "s":
        return f"{value:.0f} s"
    if unit == "w":
        return f"{value:.2f}"
    return f"{value:+.0f}"


def goal_text(goal: Goal) -> str:
    sign = "≥" if goal.better == "high" else "≤"
    return f"{sign} {show(goal.median, goal.unit)} / {sign} {show(goal.worst, goal.unit)}"
