"""Benchmark: a new target introduced by shadow traffic against one introduced cold (issue
42), over the routing benchmark's workload family, on the real routing core.

Each member of the family (family_workloads.py, its drift left out: nothing is sick here)
starts without its budget target — the cheap one a dynamic-score group should send its
simple requests to once it knows it. One observation window in, a reload adds it as a live
target (the router rebuilt and carried over, as `operations/reload.py` does):

- **cold**: the target was not there before; its first observations are callers' requests;
- **shadow**: for that first window the group mirrored `--sample-percent` of its
  decisions to it (`rollout.shadow_traffic`, `shadow_only: true`): the bounds are the
  shipped ones (rollout/mirror_bounds.py), each mirrored request is served by the
  simulated provider and recorded as an observation of the target, as the shadow
  listener's access log records it on the stack (docs/rollout.md §4).

After the reload, per member: how many caller requests until the new target carries its
steady share (its share of primaries over a sliding 100 decisions first reaches 90 % of
its share in the run's last window), the caller requests it served while still cold (no
warm score: the blend's `cold` term), the mean cost per request in the first window after
the reload against the last window, and what the mirror spent (requests, USD). Providers
and network are simulated as in family_sim.py; routing, observations, bounds and
reloads are the shipped code.

Usage:  PYTHONPATH=.:bench .venv/bin/python bench/target_introduction.py [--seeds 24]
            [--window 60] [--rate 8] [--sample-percent 5] [--workers 2]
            [--output bench/results/target_introduction.md]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from family_sim import GROUP, Simulation, config_data
from family_workloads import Member, member
from mode_runner import publish

from sidecar.config.loading import load_config_data
from sidecar.observe.records import Observation, Outcome
from sidecar.rollout.mirror_bounds import MirrorBounds
from sidecar.routing.decision import Decision
from sidecar.routing.router import Router

NEW_SLOT = "budget"
WINDOWS_BEFORE, WINDOWS_AFTER = 1.0, 2.0
SLIDING = 100
USED_WELL = 0.9


def _configs(base: Member, window: int, sample_percent: float):  # type: ignore[no-untyped-def]
    """(before cold, before with the mirror, after): the member's group without its new
    target, with it as a shadow-only candidate, and with it live."""
    after = config_data(base, "dynamic_score", window)
    targets = after["models"][GROUP]["targets"]
    new = next(t for t in targets if t["provider"] == NEW_SLOT)
    cold = {**after, "models": {GROUP: {**after["models"][GROUP],
                                        "targets": [t for t in targets if t is not new]}}}
    mirrored = {**after, "models": {GROUP: {**after["models"][GROUP], "rollout": {
        "shadow_traffic": {"target": f"{NEW_SLOT}/{new['model_ref']}", "shadow_only": True,
                           "sample_percent": sample_percent, "max_per_minute": 600,
                           "max_daily_usd": 1000.0, "max_concurrent": 16}}}}}
    return (load_config_data(cold), load_config_data(mirrored), load_config_data(after))


class _Watching:
    """The router as the simulation calls it, each decision shown to `seen`."""

    def __init__(self, router: Router, seen) -> None:  # type: ignore[no-untyped-def]
        self.router, self._seen = router, seen

    def decide(self, summary, store, external=None):  # type: ignore[no-untyped-def]
        decision = self.router.decide(summary, store, external)
        if isinstance(decision, Decision):
            self._seen(summary, decision)
        return decision


class Introduction(Simulation):
    def __init__(self, base: Member, variant: str, window: int, rate: float,
                 sample_percent: float) -> None:
        quiet = replace(base, sick="none")  # no drift: the introduction is the event
        super().__init__(quiet, "dynamic_score", window, rate)
        cold, mirrored, after = _configs(quiet, window, sample_percent)
        before = mirrored if variant == "shadow" else cold
        self.router = _Watching(Router(before, clock=self.clock, wall_clock=self.clock),
                                self._after_decision)  # type: ignore[assignment]
        self.group = before.models[GROUP]
        self._job = None
        self.after = after
        self.variant = variant
        self.intro_at = WINDOWS_BEFORE * window
        self.end_at = (WINDOWS_BEFORE + WINDOWS_AFTER) * window
        self.jobs = [job for job in self.jobs if job.at < self.end_at]
        mirror = before.models[GROUP].rollout
        self.bounds = (MirrorBounds(mirror.shadow_traffic, self.clock, self.clock)
                       if mirror is not None else None)
        self.new_label = next(f"{t.provider}/{t.model_ref}"
                              for t in after.models[GROUP].targets if t.provider == NEW_SLOT)
        self.mirrored = 0
        self.mirror_usd = 0.0
        self.decided: list[tuple[float, str, bool]] = []  # after the reload: (at, primary, cold)
        self.at(self.intro_at, self.reload)

    def reload(self) -> None:
        """As operations/reload.py: a new router that keeps what the old one learned."""
        router = Router(self.after, clock=self.clock, wall_clock=self.clock)
        router.carry_over(self.router.router)  # type: ignore[attr-defined]
        self.router.router = router  # type: ignore[attr-defined]
        self.group = self.after.models[GROUP]
        self.fallback = self.group.fallback

    def request(self, job, turn, messages, before) -> None:  # type: ignore[no-untyped-def]
        if self.clock.now >= self.end_at:
            return
        self._job = job
        super().request(job, turn, messages, before)

    def _after_decision(self, summary, decision: Decision) -> None:  # type: ignore[no-untyped-def]
        now, job = self.clock.now, self._job
        if now >= self.intro_at:
            row = decision.trace.candidate(self.new_label)
            self.decided.append((now, decision.primary.label,
                                 row is not None and not row.warm))
            return
        bounds = self.bounds
        if bounds is None or not bounds.sampled():
            return
        profile = self.profiles[NEW_SLOT]
        estimate = (summary.estimated_input_tokens * profile.input_per_mtok
                    + summary.output_budget * profile.output_per_mtok) / 1e6
        if bounds.admit(estimate) is not None:
            return
        day = bounds.day
        duration, ttfb, outcome, _, tokens = self.serve(profile, NEW_SLOT, job)
        self.mirrored += 1

        def done() -> None:
            failed = outcome is not Outcome.OK
            cost = 0.0 if failed else (summary.estimated_input_tokens * profile.input_per_mtok
                                       + tokens * profile.output_per_mtok) / 1e6
            self.mirror_usd += cost
            bounds.done(day, estimate, cost)
            self.store.record(Observation(
                self.new_label, outcome, latency_ms=1000 * duration,
                ttfb_ms=None if failed else 1000 * ttfb, upstream_ms=1000 * duration,
                output_tokens=None if failed else tokens, streamed=job.stream))

        self.at(now + duration, done)


@dataclass(frozen=True)
class Outcomes:
    requests_until_used_well: int | None   # None: never within the run
    cold_serves: int
    steady_share: float
    first_window_cost: float               # mean USD per request after the reload
    steady_cost: float
    mirrored: int
    mirror_usd: float


def measure(sim: Introduction) -> Outcomes:
    run = sim.simulate()
    window = sim.end_at - sim.intro_at
    last = [label for at, label, _ in sim.decided if at >= sim.end_at - window / 2]
    steady = sum(label == sim.new_label for label in last) / len(last) if last else 0.0
    recent: deque[bool] = deque(maxlen=SLIDING)
    until = None
    for index, (_, label, _) in enumerate(sim.decided):
        recent.append(label == sim.new_label)
        if len(recent) == SLIDING and steady > 0 and \
                sum(recent) / SLIDING >= USED_WELL * steady:
            until = index + 1
            break
    cold = sum(1 for _, label, is_cold in sim.decided if is_cold and label == sim.new_label)

    def cost(since: float, until_at: float) -> float:
        costs = [s.cost for s in run.results if since <= s.at < until_at and not s.error]
        return statistics.fmean(costs) if costs else 0.0

    first = cost(sim.intro_at, sim.intro_at + window / 2)
    return Outcomes(until, cold, steady, first, cost(sim.end_at - window / 2, sim.end_at),
                    sim.mirrored, sim.mirror_usd)


def _one(task: tuple[int, str, int, float, float]) -> tuple[int, str, Outcomes]:
    seed, variant, window, rate, sample = task
    return seed, variant, measure(Introduction(member(seed), variant, window, rate, sample))


def report(results: dict[tuple[int, str], Outcomes], seeds: list[int], window: int,
           rate: float, sample: float, seconds: float) -> str:
    def cell(outcome: Outcomes) -> str:
        if outcome.steady_share == 0:
            return "– (no steady share)"
        value = outcome.requests_until_used_well
        return "never" if value is None else str(value)

    lines = [
        "# A new target introduced by shadow traffic, against introduced cold",
        "",
        f"`bench/target_introduction.py --seeds {len(seeds)} --window {window} --rate "
        f"{rate:g} --sample-percent {sample:g}`, {time.strftime('%Y-%m-%d', time.gmtime())}; "
        f"simulated on the real routing core in {seconds:.0f} s. Each member's budget target "
        f"joins after {WINDOWS_BEFORE:g} window by a reload; `shadow` mirrored "
        f"{sample:g} % of the decisions to it during that window. \"Used well\": its share "
        f"of the last {SLIDING} decisions first at {USED_WELL:.0%} of its share in the "
        "run's last half window. Cost: mean USD per answered request, first half window "
        "after the reload against the last.",
        "",
        "| seed | member | variant | requests until used well | cold serves | steady share "
        "| cost first ½ window | cost last ½ window | mirrored | mirror USD |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for seed in seeds:
        for variant in ("cold", "shadow"):
            o = results[seed, variant]
            lines.append(
                f"| {seed} | {member(seed).name.split(',')[0]} | {variant} | "
                f"{cell(o)} | {o.cold_serves} | "
                f"{o.steady_share:.1%} | {o.first_window_cost * 1000:.3f} m$ | "
                f"{o.steady_cost * 1000:.3f} m$ | {o.mirrored} | {o.mirror_usd:.4f} |")
    # Members where the new target has a steady share under both variants (a target the
    # router leaves out at the end, such as a flapping one in its bad phase, has no
    # "used well" to reach).
    shared = [seed for seed in seeds
              if all(results[seed, v].steady_share > 0 for v in ("cold", "shadow"))]
    lines += ["", f"Over the family (median / worst; requests until used well over the "
              f"{len(shared)} of {len(seeds)} members where the new target has a steady "
              f"share in both variants; {SLIDING} is the least possible):", "",
              "| variant | requests until used well | cold serves | first ½ window cost over "
              "steady | mirrored requests | mirror USD |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for variant in ("cold", "shadow"):
        rows = [results[seed, variant] for seed in seeds]
        until = [results[seed, variant].requests_until_used_well for seed in shared]
        reached = [u for u in until if u is not None]
        ratio = [o.first_window_cost / o.steady_cost for o in rows if o.steady_cost]
        lines.append(
            f"| {variant} | {statistics.median(reached):.0f} / "
            f"{'never' if None in until else max(reached)} | "
            f"{statistics.median(o.cold_serves for o in rows):.0f} / "
            f"{max(o.cold_serves for o in rows)} | "
            f"{statistics.median(ratio):.2f} / {max(ratio):.2f} | "
            f"{statistics.median(o.mirrored for o in rows):.0f} | "
            f"{statistics.median(o.mirror_usd for o in rows):.4f} |")
    saved = [results[seed, "cold"].requests_until_used_well
             - results[seed, "shadow"].requests_until_used_well for seed in shared
             if results[seed, "cold"].requests_until_used_well is not None
             and results[seed, "shadow"].requests_until_used_well is not None]
    if saved:
        lines += ["", f"Caller requests saved per member (cold − shadow): median "
                  f"{statistics.median(saved):.0f}, least {min(saved)}, most {max(saved)}; "
                  f"members where shadow was slower: {sum(s < 0 for s in saved)} of "
                  f"{len(saved)}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument("--window", type=int, default=60)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--sample-percent", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    tasks = [(seed, variant, args.window, args.rate, args.sample_percent)
             for seed in seeds for variant in ("cold", "shadow")]
    started = time.monotonic()
    if args.workers <= 1:
        done = list(map(_one, tasks))
    else:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            done = list(pool.imap_unordered(_one, tasks))
    results = {(seed, variant): outcome for seed, variant, outcome in done}
    publish(report(results, seeds, args.window, args.rate, args.sample_percent,
                   time.monotonic() - started), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
