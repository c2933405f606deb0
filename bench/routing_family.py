"""The family run of `routing_quality.py --family` (issue #31): every seed's member of the
workload family (family_workloads.py) simulated on the real routing core (family_sim.py)
under `weighted` and each dynamic-score variant, then per seed against `weighted` and over
the seeds as the median and the worst decile of each figure, beside its goal
(family_report.py). Seeds run in parallel worker processes; each run is deterministic."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence

from family_report import GOALS, Figures, figures, goal_text, per_seed, show, summary
from family_sim import PHASE_WINDOWS, simulate
from family_workloads import member


def _one(task: tuple[int, str, int, float]) -> tuple[int, str, Figures]:
    seed, strategy, window, rate = task
    return seed, strategy, figures(simulate(member(seed), strategy, window, rate))


def run_family(seeds: Sequence[int], strategies: Sequence[str], window: int, rate: float,
               workers: int) -> dict[tuple[int, str], Figures]:
    tasks = [(seed, strategy, window, rate) for seed in seeds
             for strategy in ("weighted", *strategies)]
    if workers <= 1:
        return {(s, name): f for s, name, f in map(_one, tasks)}
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return {(s, name): f for s, name, f in pool.imap_unordered(_one, tasks)}


def family_report(results: dict[tuple[int, str], Figures], seeds: Sequence[int],
                  strategies: Sequence[str], window: int, rate: float, seconds: float) -> str:
    lines = [f"# Routing quality over a family of workloads ({len(seeds)} seeds)", "",
             f"Window {window} s; phases warm / steady / degrade / recover of "
             + " / ".join(f"{w:g}" for w in PHASE_WINDOWS.values())
             + f" windows; about {rate:g} requests/s; the SPEC sample's dynamic_score policy "
             "as written (its own window unless `--window` says otherwise), against "
             f"`weighted` on the same requests. Simulated on the real routing core in "
             f"{seconds:.0f} s (bench/family_sim.py; docs/routing-under-drift.md §8).", ""]
    for strategy in strategies:
        rows = [per_seed(results[seed, "weighted"], results[seed, strategy]) for seed in seeds]
        lines += [f"## `{strategy}`", "", "| figure | goal (median / worst decile) | median "
                  "| worst decile | met |", "| --- | --- | ---: | ---: | --- |"]
        for goal, median, worst, met in summary(rows):
            lines.append(f"| {goal.name} | {goal_text(goal)} | {show(median, goal.unit)} | "
                         f"{show(worst, goal.unit)} | {'yes' if met else '**no**'} |")
        lines += ["", "Per seed:", "", "| seed | member | " + " | ".join(g.name for g in GOALS)
                  + " |", "| ---: | --- |" + " ---: |" * len(GOALS)]
        for seed, row in zip(seeds, rows, strict=True):
            cells = " | ".join(show(row[g.name], g.unit) for g in GOALS)
            lines.append(f"| {seed} | {member(seed).name} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def main_family(seeds: int, strategies: Sequence[str], window: int, rate: float,
                workers: int) -> str:
    started = time.monotonic()
    chosen = list(range(seeds))
    results = run_family(chosen, strategies, window, rate, workers)
    return family_report(results, chosen, strategies, window, rate,
                         time.monotonic() - started)
