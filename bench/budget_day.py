"""Benchmark: a simulated day of one caller with a daily spend budget (issue #31), with and
without `budget_pressure` in the group's score term.

The shipped parts on one simulated clock: the quota counters (admission, and the spend they
count after each reply) and the router (dynamic_score with its blend and rotation). Two
targets: a fast, dear one and a slower, cheap one, with fixed observations, so only the
budget moves the mix. One request every `--every` seconds all day (UTC), each of the same
size. Without the pressure term the group keeps its mix until the quota refuses; with it,
spending leans on the cheap target as the budget runs down and the day lasts longer.

Usage: .venv/bin/python bench/budget_day.py [--budget 25] [--every 20]
           [--output bench/results/budget_day.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.config.loading import load_config_data
from sidecar.dialects.apis import Dialect
from sidecar.quotas.counters import QuotaCounters
from sidecar.routing.decision import Decision
from sidecar.routing.observations import ObservationSnapshot, TargetObservations
from sidecar.routing.request import RequestSummary
from sidecar.routing.router import Router

MIDNIGHT = 1_767_225_600.0  # a UTC midnight
INPUT_TOKENS, OUTPUT_TOKENS = 500, 300
PRICES = {"dear": (10.0, 40.0), "cheap": (0.5, 2.0)}
TERMS = {
    "without": "0.45 * cost_score + 0.55 * latency_score",
    "with": "0.45 * cost_score * (1 + budget_pressure) + 0.55 * latency_score * "
            "(1 - budget_pressure)",
}
VIEW = ObservationSnapshot({"p/dear": TargetObservations(count=500, p95_latency_ms=800),
                            "p/cheap": TargetObservations(count=500, p95_latency_ms=2_400)})


def config(term: str, budget: float):  # type: ignore[no-untyped-def]
    targets = [{"provider": "p", "model_ref": name, "weight": weight,
                "pricing": {"input_per_mtok": prices[0], "output_per_mtok": prices[1]}}
               for (name, prices), weight in zip(PRICES.items(), (70, 30), strict=True)]
    return load_config_data({
        "providers": {"p": {"base_url": "http://127.0.0.1:9/v1"}},
        "callers": [{"name": "team", "token_sha256": "0" * 64,
                     "quotas": {"spend_per_day_usd": budget}}],
        "models": {"g": {"strategy": "dynamic_score", "targets": targets,
                         "routing_policy": {"dynamic_score": {
                             "min_observations": 20, "affinity": {"enabled": False},
                             "score_terms": [{"name": "t", "expression": term}]}}}}})


class Clock:
    def __init__(self) -> None:
        self.now = MIDNIGHT

    def __call__(self) -> float:
        return self.now


def day(term: str, budget: float, every: float) -> list[dict[str, float]]:
    """Per hour: served, refused, spend so far, the cheap share, the pressure at its end."""
    cfg = config(term, budget)
    clock = Clock()
    quotas = QuotaCounters(cfg, clock)
    router = Router(cfg, clock=clock, wall_clock=clock)
    hours = [dict(served=0, refused=0, cheap=0, spent=0.0, pressure=0.0) for _ in range(24)]
    spent = 0.0
    n = 0
    while (at := MIDNIGHT + n * every) < MIDNIGHT + 86_400:
        clock.now = at
        hour = hours[int((at - MIDNIGHT) // 3600)]
        n += 1
        if quotas.admit("team", "g") is not None:
            hour["refused"] += 1
            continue
        pressure = quotas.spend_pressure("team", "g")
        decision = router.decide(RequestSummary("g", "team", Dialect.OPENAI_CHAT,
                                                prompt_chars=4 * INPUT_TOKENS,
                                                max_tokens_cap=OUTPUT_TOKENS,
                                                budget_pressure=pressure), VIEW)
        assert isinstance(decision, Decision)
        name = decision.primary.target.model_ref
        price_in, price_out = PRICES[name]
        cost = (INPUT_TOKENS * price_in + OUTPUT_TOKENS * price_out) / 1e6
        quotas.used("team", "g", INPUT_TOKENS + OUTPUT_TOKENS, cost, at)
        spent += cost
        hour["served"] += 1
        hour["cheap"] += name == "cheap"
        hour["spent"] = spent
        hour["pressure"] = quotas.spend_pressure("team", "g")
    last = 0.0
    for hour in hours:  # hours with nothing served keep the running total
        hour["spent"] = last = hour["spent"] or last
    return hours


def report(budget: float, every: float) -> str:
    runs = {name: day(term, budget, every) for name, term in TERMS.items()}
    lines = [f"# A day against a ${budget:g} spend budget", "",
             f"One request every {every:g} s (UTC day), {INPUT_TOKENS} in / {OUTPUT_TOKENS} "
             f"out tokens; dear target ${PRICES['dear'][0]:g}/${PRICES['dear'][1]:g} per "
             f"Mtok and faster, cheap ${PRICES['cheap'][0]:g}/${PRICES['cheap'][1]:g}; "
             "weights 70/30.", "",
             "Score term without pressure: `" + TERMS["without"] + "`; with: `"
             + TERMS["with"] + "`.", "",
             "| hour (UTC) | spent without | cheap share without | refused without "
             "| spent with | pressure with | cheap share with | refused with |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for h in range(24):
        a, b = runs["without"][h], runs["with"][h]
        lines.append(
            f"| {h:02d} | ${a['spent']:.2f} | {_share(a)} | {a['refused']} | "
            f"${b['spent']:.2f} | {b['pressure']:.2f} | {_share(b)} | {b['refused']} |")
    totals = {name: (sum(h["served"] for h in hours), sum(h["refused"] for h in hours))
              for name, hours in runs.items()}
    lines += ["", f"Served / refused over the day: without {totals['without'][0]} / "
              f"{totals['without'][1]}; with {totals['with'][0]} / {totals['with'][1]}."]
    return "\n".join(lines) + "\n"


def _share(hour: dict[str, float]) -> str:
    return f"{hour['cheap'] / hour['served']:.0%}" if hour["served"] else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=25.0, help="spend_per_day_usd")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between requests")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    text = report(args.budget, args.every)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
