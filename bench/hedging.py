"""Benchmark: hedged first tokens through real Envoy (issue #31, docs/hedging.md).

The shipped stack (`sidecar up`: Envoy from the wheel and the sidecar) in front of two
fake providers: the group's primary answers in about 120 ms, but one request in twenty
(`--tail-share`) waits `--tail-s` more before anything is sent (a request queued behind
others, a cold replica); the second target answers in about 150 ms and has no tail. The
group is `failover` [primary, second]; it runs once without `hedge` and once with the
default hedge policy, on the same seeded workload: streamed Chat requests through the
openai SDK at a fixed concurrency, time to first event measured by the caller. The first
`--warm-up` requests of each run (the deadline needs evidence first) are not counted.

Reports, per seed and over seeds, p50/p95/p99 time to first event in both runs and the
extra upstream requests hedging cost (the second target's requests, as a share of the
group's).

Usage: .venv/bin/python bench/hedging.py [--seeds 3] [--requests 600] [--concurrency 4]
           [--output bench/results/hedging.md]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

KEYS = {"primary": "key-primary", "second": "key-second"}
TOKEN = "bench-hedging-token"
CONFIG = """\
providers:
  primary: {{base_url: '{primary}', credential: {{env: KEY_PRIMARY}}}}
  second: {{base_url: '{second}', credential: {{env: KEY_SECOND}}}}
callers: [{{name: bench, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50}}
models:
  agent:
    strategy: failover
    targets:
      - {{provider: primary, model_ref: p}}
      - {{provider: second, model_ref: s}}
{hedge}"""


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def one_run(seed: int, hedge: bool, args: argparse.Namespace) -> dict[str, float]:
    primary = Behaviour(latency_s=0.12, latency_spread=0.15, slow_start_share=args.tail_share,
                        slow_start_s=args.tail_s)
    fakes = [FakeProvider("primary", api_key=KEYS["primary"], behaviour=primary, seed=seed),
             FakeProvider("second", api_key=KEYS["second"], seed=seed,
                          behaviour=Behaviour(latency_s=0.15, latency_spread=0.15))]
    hedge_block = "    hedge: {}\n" if hedge else ""
    with tempfile.TemporaryDirectory() as workdir, keyed_stack(
            Path(workdir), fakes, lambda providers: CONFIG.format(
                primary=providers.base_url("primary"), second=providers.base_url("second"),
                digest=hashlib.sha256(TOKEN.encode()).hexdigest(), hedge=hedge_block),
            KEYS) as (up, providers):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)

        def first_event(n: int) -> float:
            started = time.monotonic()
            stream = client.chat.completions.create(
                model="agent", stream=True,
                messages=[{"role": "user", "content": f"seed {seed} question {n}"}])
            first = None
            for _chunk in stream:
                if first is None:
                    first = time.monotonic() - started
            return first if first is not None else float("nan")

        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(first_event, range(args.warm_up)))
            counted_from = [len(providers.provider(name).received)
                            for name in ("primary", "second")]
            times = list(pool.map(first_event, range(args.warm_up, args.requests)))
        second = len(providers.provider("second").received) - counted_from[1]
    counted = args.requests - args.warm_up
    return {"p50": percentile(times, 0.5) * 1000, "p95": percentile(times, 0.95) * 1000,
            "p99": percentile(times, 0.99) * 1000, "extra": second / counted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--warm-up", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tail-share", type=float, default=0.05)
    parser.add_argument("--tail-s", type=float, default=2.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rows = []
    for seed in range(1, args.seeds + 1):
        off = one_run(seed, False, args)
        on = one_run(seed, True, args)
        rows.append((seed, off, on))
        print(f"seed {seed}: off p99 {off['p99']:.0f} ms, on p99 {on['p99']:.0f} ms, "
              f"extra {on['extra']:.1%}", flush=True)
    lines = [
        "# Hedged first tokens (bench/hedging.py)", "",
        f"Primary: ~120 ms to first event, {args.tail_share:.0%} of requests {args.tail_s:g} s "
        f"later; second target ~150 ms, no tail. {args.requests - args.warm_up} streamed "
        f"requests counted per run (after {args.warm_up} of warm-up), concurrency "
        f"{args.concurrency}, through real Envoy; hedge policy: the defaults "
        "(budget 5 % of the group's decisions, burst 20, deadline = the primary's TTFB p95, "
        "at most 4× its median).", "",
        "| seed | p50 off | p50 on | p95 off | p95 on | p99 off | p99 on | p99 on/off "
        "| extra upstream requests |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for seed, off, on in rows:
        lines.append(f"| {seed} | {off['p50']:.0f} ms | {on['p50']:.0f} ms | {off['p95']:.0f} ms "
                     f"| {on['p95']:.0f} ms | {off['p99']:.0f} ms | {on['p99']:.0f} ms "
                     f"| {on['p99'] / off['p99']:.2f}× | {on['extra']:.1%} |")
    ratio = statistics.median(on["p99"] / off["p99"] for _, off, on in rows)
    worst_extra = max(on["extra"] for _, _, on in rows)
    lines += ["", f"Median p99 on/off: {ratio:.2f}× (goal ≤ 0.50×); largest extra upstream "
              f"requests: {worst_extra:.1%} (goal: within the budget, 5 %; counted over the "
              "measured requests, the budget's tokens over all of them)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
