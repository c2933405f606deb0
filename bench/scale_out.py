"""How routed throughput grows with sidecar processes behind one Envoy (issue #7).

Rows: Envoy + 1, 2 and 3 `sidecar serve` processes (SPEC dynamic_score group, the same
configuration in each), Envoy spreading its ext_proc streams over them; wrk at concurrency
32 with 1 KB bodies. What it means for process-local observations and affinity is in
docs/performance.md ("Beyond one process").

Usage:  .venv/bin/python bench/scale_out.py [--rounds 2] [--seconds 5] [--output F]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_processes import TOKEN, fast_provider, sidecar_stack
from mode_runner import publish
from wrk_load import run_wrk

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import FakeProvider

COUNTS = (1, 2, 3)


def one(workdir: Path, fast_port: int, drip_url: str, count: int,
        seconds: float) -> dict[str, float]:
    processes, port = sidecar_stack(workdir, "dynamic_score", fast_port, drip_url, TOKEN,
                                    processes=count)
    try:
        run_wrk(port, "/v1/chat/completions", "adaptive-agent", TOKEN, 32, 2)
        before = processes.cpu_seconds()
        result = run_wrk(port, "/v1/chat/completions", "adaptive-agent", TOKEN, 32, seconds)
        after = processes.cpu_seconds()
        sidecar_cpu = sum(after[name] - before[name] for name in after if name != "envoy")
        return {"rps": result.requests_per_s, "p99": result.p99_ms,
                "sidecar_us": sidecar_cpu / result.requests * 1e6,
                "envoy_us": (after["envoy"] - before["envoy"]) / result.requests * 1e6}
    finally:
        processes.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    runs: dict[int, list[dict[str, float]]] = {count: [] for count in COUNTS}
    with ProviderThread([FakeProvider("drip")]) as drip, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        try:
            for _ in range(args.rounds):
                for count in COUNTS:
                    runs[count].append(one(workdir, fast_port, drip.base_url("drip"), count,
                                           args.seconds))
        finally:
            provider.stop()
    lines = [f"## Sidecar processes behind one Envoy: {args.rounds} alternating rounds, "
             f"{args.seconds:g} s at concurrency 32; medians", "",
             "| sidecar processes | req/s | p99 ms | sidecar CPU µs / req (all processes) "
             "| Envoy CPU µs / req |", "| --- | --- | --- | --- | --- |"]
    for count, results in runs.items():
        m = {key: statistics.median(r[key] for r in results) for key in results[0]}
        lines.append(f"| {count} | {m['rps']:,.0f} | {m['p99']:.1f} | {m['sidecar_us']:.0f} "
                     f"| {m['envoy_us']:.0f} |")
    publish("\n".join(lines) + "\n", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
