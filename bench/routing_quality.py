"""Benchmark: routing quality under drift (issues #14 and #31), `weighted` against
`dynamic_score`.

`--family` (issue #31): a documented family of workloads (target profiles, traffic mixes,
drift kinds: bench/family_workloads.py), one member per seed, simulated on the real routing
core (bench/family_sim.py), at least 20 seeds; per figure the median and the worst decile
against `weighted`, beside the goals (bench/routing_family.py). Minutes, not hours:

  .venv/bin/python bench/routing_quality.py --family --seeds 24 [--window 600]
      [--strategies dynamic_score,dynamic_score@work_normalized] [--workers 2]
      [--output bench/results/routing_family.md]

`--stack-family` (issue 41): family members through the real stack, `weighted` and
`dynamic_score` side by side, with the simulator's figures for the same members beside
them (bench/routing_stack_family.py); 8 windows per member (4 minutes at a 30 s window):

  .venv/bin/python bench/routing_quality.py --stack-family --seed-list 0,3,6,9
      [--window 30] [--rate 8] [--output bench/results/routing_stack_family.md]
      [--raw bench/results/routing_stack_family.json]

Without either: one workload through the real stack, as follows (how the simulation is
checked against real Envoy).

For each strategy, a fresh stack (`sidecar up` with real Envoy and the real sidecar) in
front of three fake providers (bench/drift_workload.py); the same seeded mixed workload is
sent with the official `openai` SDK (simple questions, debugging requests, multi-turn
conversations resending their history, a quarter streamed) through four phases:

  warm     every target healthy, the router learning
  steady   every target healthy
  degrade  the budget target ten times slower with 10 % 503s
  recover  the budget target healthy again

It reports per strategy and phase the cost per 1,000 simple and complex requests (from
each reply's usage and the serving target's price), client latency p50/p95, client-visible
errors, complex requests served by validated targets, multi-turn stickiness, each
target's share of upstream attempts per 5 s, and for the degraded target the time to
drain, its share after the drain and the time to half its steady share after recovery
(bench/drift_report.py). Prices are the configuration's: the router reads them from there.

Usage:  .venv/bin/python bench/routing_quality.py [--seed 7] [--rate 8] [--window 30]
            [--strategies weighted,dynamic_score] [--output bench/results/routing_quality.md]
Loopback only; every process it starts it also stops. About 4 minutes per strategy.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import openai
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift_report import Attempt, Result, report
from drift_workload import CHAT, DEGRADED, PROFILES, Job, behaviour, with_reply, workload
from sdk_chat import chat

from sidecar import devstack
from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import FakeProvider

TOKEN = "routing-quality-token"
GROUP = "drift-agent"
THINK_S = 1.0  # a user's pause between a reply and the next turn


@dataclass(frozen=True)
class Phases:
    warm: float
    steady: float
    degrade: float
    recover: float

    @property
    def starts(self) -> dict[str, float]:
        return {"warm": 0.0, "steady": self.warm, "degrade": self.warm + self.steady,
                "recover": self.warm + self.steady + self.degrade}

    @property
    def total(self) -> float:
        return self.warm + self.steady + self.degrade + self.recover


def config_text(strategy: str, providers: ProviderThread, window: int) -> str:
    """`strategy` may carry a latency basis: `dynamic_score@work_normalized`."""
    strategy, _, basis = strategy.partition("@")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    lines = ["providers:"]
    lines += [f"  {p.name}: {{base_url: '{providers.base_url(p.name)}'}}" for p in PROFILES]
    lines += [f"callers: [{{name: bench, token_sha256: {digest}}}]",
              "models:", f"  {GROUP}:", f"    strategy: {strategy}", "    targets:"]
    for p in PROFILES:
        lines.append(
            f"      - {{provider: {p.name}, model_ref: {p.model}, weight: {p.weight}, "
            f"tags: [{', '.join(p.tags)}], pricing: {{input_per_mtok: {p.input_per_mtok}, "
            f"output_per_mtok: {p.output_per_mtok}}}, evaluation: {{quality_score: "
            f"{p.quality}}}}}")
    policy = spec_policy(window)
    if basis:
        policy["dynamic_score"]["latency_basis"] = basis
    group = yaml.safe_dump({"routing_policy": policy}, sort_keys=False)
    return "\n".join(lines) + "\n" + textwrap.indent(group, "    ")


def spec_policy(window: int) -> dict:
    """The SPEC sample's policy (the demo configuration carries it verbatim), with the
    window and evidence floor of the issue's trial."""
    demo = yaml.safe_load((Path(devstack.__file__).parent / "demo-config.yaml").read_text())
    policy = demo["models"]["adaptive-agent"]["routing_policy"]
    policy["dynamic_score"].update(observation_window_seconds=window, min_observations=10)
    return policy


async def _send(client: openai.AsyncOpenAI, job: Job, turn: int, messages: list[dict],
                start: float) -> tuple[Result, str]:
    """One request; its result and the reply text (for the conversation's next turn)."""
    sent = time.monotonic()
    reply = await chat(client, GROUP, messages, job.stream)
    return Result(job.kind, job.ident, turn, sent - start, reply.seconds, reply.model,
                  reply.prompt_tokens, reply.completion_tokens, reply.error), reply.text


async def _job(client: openai.AsyncOpenAI, job: Job, start: float, results: list[Result]):
    await asyncio.sleep(max(0.0, start + job.at - time.monotonic()))
    messages = job.messages
    result, text = await _send(client, job, 0, messages, start)
    results.append(result)
    for turn, follow_up in enumerate(job.follow_ups, 1):
        if result.error is not None:
            return  # a failed turn ends the conversation, as a user would give up
        await asyncio.sleep(THINK_S)
        messages = with_reply(messages, text, follow_up)
        result, text = await _send(client, job, turn, messages, start)
        results.append(result)


async def _drive(up: UpProcess, providers: ProviderThread, jobs: list[Job], phases: Phases
                 ) -> tuple[float, list[Result]]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(limits=limits, timeout=180) as http:
        client = openai.AsyncOpenAI(base_url=up.base_url + "/v1", api_key=TOKEN,
                                    max_retries=0, http_client=http)
        results: list[Result] = []
        start = time.monotonic()
        budget = providers.provider(DEGRADED)
        profile = next(p for p in PROFILES if p.name == DEGRADED)

        async def drift() -> None:
            starts = phases.starts
            await asyncio.sleep(start + starts["degrade"] - time.monotonic())
            budget.behaviour = behaviour(profile, degraded=True)
            await asyncio.sleep(start + starts["recover"] - time.monotonic())
            budget.behaviour = behaviour(profile)

        await asyncio.gather(drift(), *(_job(client, job, start, results) for job in jobs))
        return start, results


def run_strategy(strategy: str, jobs: list[Job], phases: Phases, window: int, seed: int,
                 workdir: Path, log_decisions: bool = False
                 ) -> tuple[list[Result], list[Attempt]]:
    fakes = [FakeProvider(p.name, seed=seed) for p in PROFILES]
    for fake, profile in zip(fakes, PROFILES, strict=True):
        fake.behaviour = behaviour(profile)
    with ProviderThread(fakes) as providers:
        config = workdir / f"{strategy}.yaml"
        config.write_text(config_text(strategy, providers, window))
        up = UpProcess(["--config", str(config), *(["--log-decisions"] * log_decisions)],
                       log_path=workdir / f"{strategy}.log")
        with up.running():
            print(f"{strategy}: running {phases.total:.0f} s of workload ...", flush=True)
            start, results = asyncio.run(_drive(up, providers, jobs, phases))
        attempts = [Attempt(r.at - start, fake.name)
                    for fake in fakes for r in list(fake.received)]
    return results, attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", action="store_true",
                        help="the family of workloads, simulated on the routing core")
    parser.add_argument("--stack-family", action="store_true",
                        help="family members through the real stack, beside the simulator")
    parser.add_argument("--seeds", type=int, default=24,
                        help="--family: how many members (--stack-family: 4)")
    parser.add_argument("--seed-list", help="--stack-family: these members (e.g. 0,3,6)")
    parser.add_argument("--workers", type=int, default=2, help="--family: processes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second")
    parser.add_argument("--window", type=int, default=None,
                        help="observation window, s (default: 30; --family: 600, the SPEC's)")
    parser.add_argument("--phases", default="20,40,90,60",
                        help="warm,steady,degrade,recover seconds")
    parser.add_argument("--strategies", default="weighted,dynamic_score",
                        help="comma-separated; dynamic_score@work_normalized (or "
                             "@observed_p95, the default) picks the latency basis")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--raw", type=Path,
                        help="also write every result as JSON lines (--stack-family: the "
                             "stack's figures per member, reused where present)")
    parser.add_argument("--logs", type=Path,
                        help="keep each stack's log here, with every decision logged")
    args = parser.parse_args()
    if args.family:
        from routing_family import main_family
        strategies = [s for s in args.strategies.split(",") if s != "weighted"]
        if args.strategies == parser.get_default("strategies"):
            strategies = ["dynamic_score", "dynamic_score@work_normalized"]
        text = main_family(args.seeds, strategies, args.window or 600, args.rate,
                           args.workers)
        print(text)
        if args.output:
            args.output.write_text(text)
        return
    if args.stack_family:
        from routing_stack_family import stack_family
        seeds = ([int(s) for s in args.seed_list.split(",")] if args.seed_list
                 else list(range(4 if args.seeds == 24 else args.seeds)))
        strategy = next(s for s in args.strategies.split(",") if s != "weighted")
        with tempfile.TemporaryDirectory(prefix="stack-family-") as tmp:
            workdir = args.logs or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            text = stack_family(seeds, strategy, args.window or 30, args.rate, workdir,
                                args.raw)
        print(text)
        if args.output:
            args.output.write_text(text)
        return
    args.window = args.window or 30
    phases = Phases(*(float(x) for x in args.phases.split(",")))
    jobs = workload(args.seed, phases.total, args.rate)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="routing-quality-") as tmp:
        workdir = args.logs or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for strategy in args.strategies.split(","):
            runs[strategy] = run_strategy(strategy, jobs, phases, args.window, args.seed,
                                          workdir, log_decisions=args.logs is not None)
    if args.raw:
        with args.raw.open("w") as raw:
            for strategy, (results, attempts) in runs.items():
                for item in (*results, *attempts):
                    raw.write(json.dumps({"strategy": strategy, **asdict(item)}) + "\n")
    text = report(runs, phases.starts, phases.total, args.window,
                  f"seed {args.seed}, {args.rate:g} req/s, {len(jobs)} jobs "
                  f"({sum(len(j.follow_ups) + 1 for j in jobs)} requests, "
                  f"{sum(j.kind == CHAT for j in jobs)} conversations)")
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
