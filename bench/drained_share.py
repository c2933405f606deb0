"""Issue 41: a drained target's share while it is still sick, over repeated runs, one
replica and three sharing observations and ejections through Redis (Debian's
redis-server), through real Envoy.

The scenario of tests/e2e/drained.py: a two-target `dynamic_score` group (the SPEC's
`max_error_rate: 0.03`, a 30 s window) whose cheap target turns ten times slower with 10 %
503s; once every replica ejected it, `--requests` more at `--rate` a second, spread over
the replicas in turn. Per run: the sick target's share of all upstream attempts (probes,
their retries and last-resort fallbacks counted), and per replica its probing rounds
(probes so far, decisions since the target left, at each round's start) against
PROBE_SHARE. Then the spread over the runs.

Run from the repository root: `.venv/bin/python bench/drained_share.py --runs 5 --output
bench/results/drained_share.md` (about 10 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import FakeProvider
from sidecar.routing.ejection import PROBE_SHARE
from tests.e2e.drained import GROUP_YAML, HEALTHY, probing_rounds, sick_share_after_drain
from tests.redis_server import redis_server

TOKEN = "drained-share-token"
CONFIG = """\
providers:
  cheap: {{base_url: '{cheap}', credential: null}}
  dear: {{base_url: '{dear}', credential: null}}
callers: [{{name: bench, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 50}}
{fleet}models:
{group}"""
FLEET = "quotas: {redis_url: {env: DRAINED_REDIS}}\nfleet: {publish_ms: 200}\n"


def _ejected(up: UpProcess) -> bool:
    text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text
    return re.search(r'^sidecar_ejected_targets\{group="drained"\} 1(\.0)?$', text,
                     re.MULTILINE) is not None


def one_run(replicas: int, seed: int, requests: int, rate: float, workdir: Path,
            redis_url: str | None) -> dict:
    cheap = FakeProvider("cheap", behaviour=HEALTHY, seed=seed)
    dear = FakeProvider("dear", behaviour=HEALTHY, seed=seed)
    with ProviderThread([cheap, dear]) as providers, contextlib.ExitStack() as running:
        config = workdir / f"r{replicas}-s{seed}.yaml"
        config.write_text(CONFIG.format(
            cheap=providers.base_url("cheap"), dear=providers.base_url("dear"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest(),
            fleet=FLEET if replicas > 1 else "",
            group=GROUP_YAML.format(cheap="cheap", dear="dear")))
        ups = [UpProcess(["--config", str(config), "--log-decisions",
                          *(["--replica", f"r{i}"] if replicas > 1 else [])],
                         env={"DRAINED_REDIS": redis_url or ""},
                         log_path=workdir / f"r{replicas}-s{seed}-{i}.log")
               for i in range(replicas)]
        for up in ups:
            running.enter_context(up.running())
        share = sick_share_after_drain(cheap, dear, [up.listen_port for up in ups], TOKEN,
                                       lambda: all(_ejected(up) for up in ups), requests,
                                       rate)
        rounds = []
        for up in ups:
            assert up.log_path is not None
            rounds.append(probing_rounds(up.log_path, "drained", "cheap/cheap-m"))
    within = all(spent <= PROBE_SHARE * since + 1 for r, _, _ in rounds for spent, since in r)
    return {"share": share.share, "sick": share.sick, "attempts": share.total,
            "failed": share.failed, "rounds": [r for r, _, _ in rounds], "within": within}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1_200)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    began = time.monotonic()
    results: dict[int, list[dict]] = {1: [], 3: []}
    with tempfile.TemporaryDirectory(prefix="drained-share-") as tmp, redis_server() as redis:
        for seed in range(args.runs):
            for replicas in (1, 3):
                result = one_run(replicas, seed, args.requests, args.rate, Path(tmp),
                                 redis.url if replicas > 1 else None)
                print(f"{replicas} replica(s), run {seed}: {100 * result['share']:.2f} % "
                      f"({result['sick']} of {result['attempts']}), rounds "
                      f"{result['rounds']}", flush=True)
                results[replicas].append(result)
    lines = ["# A drained target's share while still sick (issue 41)", "",
             f"{time.strftime('%Y-%m-%d')}; `bench/drained_share.py --runs {args.runs}` "
             f"({(time.monotonic() - began) / 60:.0f} minutes): a two-target group, the cheap "
             "target ten times slower with 10 % 503s; once every replica ejected it, "
             f"{args.requests} requests at {args.rate:g} a second spread over the replicas. "
             "Share: the sick target's part of all upstream attempts (probes, their retries, "
             "last-resort fallbacks). Rounds within the share: at every probing round's "
             f"start, each replica's probes so far ≤ {100 * PROBE_SHARE:g} % of its "
             "decisions since the target left (+1).", "",
             "| replicas | runs | share, min / median / max | failed requests | "
             "rounds within the share |", "| ---: | ---: | --- | ---: | --- |"]
    for replicas, runs in results.items():
        shares = sorted(100 * r["share"] for r in runs)
        lines.append(f"| {replicas} | {len(runs)} | {shares[0]:.2f} / "
                     f"{statistics.median(shares):.2f} / {shares[-1]:.2f} % | "
                     f"{sum(r['failed'] for r in runs)} | "
                     f"{'all' if all(r['within'] for r in runs) else '**no**'} |")
    lines += ["", "Per run (share; each replica's rounds as (probes so far, decisions since "
              "it left)):", ""]
    for replicas, runs in results.items():
        for index, r in enumerate(runs):
            lines.append(f"- {replicas} replica(s), run {index}: {100 * r['share']:.2f} % "
                         f"({r['sick']} of {r['attempts']}); rounds {r['rounds']}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
