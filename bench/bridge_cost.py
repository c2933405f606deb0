"""The bridged path's cost (issue #16): OpenAI Chat requests through real Envoy and the real
sidecar to (1) a native OpenAI target in a configuration without bridges, (2) the same
native target in a configuration that also has a bridging group, (3) an Anthropic-only
target through a bridge. Rows alternate round by round in one run, on loopback.

Per row: requests/s at concurrency 32, p50/p99 latency at concurrency 1 and 32, and CPU
seconds per 1,000 requests of Envoy and of the sidecar. (1) vs (2) shows the native path
unchanged by bridges; (3) − (1) is what a bridge adds (the request and the answer cross the
sidecar once more each, and the answer is held whole).

Usage:  .venv/bin/python bench/bridge_cost.py [--rounds 3] [--seconds 4] [--output F]
        (wrk from Debian's package must be installed)
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_processes import TOKEN, fast_provider, sidecar_stack, wait_http
from mode_runner import publish
from wrk_load import run_wrk

CHAT_PATH = "/v1/chat/completions"
KEYS = ("rps_c32", "p50_c1", "p99_c1", "p50_c32", "p99_c32", "cpu_sidecar", "cpu_envoy")


def config(fast_port: int, bridges: bool) -> str:
    fast = f"http://127.0.0.1:{fast_port}/v1"
    text = (f"providers:\n"
            f"  gpt: {{base_url: '{fast}', credential: null}}\n"
            f"  claude: {{base_url: '{fast}', credential: null, "
            f"dialects: [anthropic_messages]}}\n"
            f"callers: [{{name: bench, token_sha256: "
            f"{hashlib.sha256(TOKEN.encode()).hexdigest()}}}]\n"
            f"models:\n"
            f"  native: {{targets: [{{provider: gpt, model_ref: m}}]}}\n")
    if bridges:
        text += "  bridged: {bridges: true, targets: [{provider: claude, model_ref: m}]}\n"
    return text


@dataclass
class Row:
    name: str
    model: str
    bridges: bool
    results: list[dict[str, float]] = field(default_factory=list)


def measure(row: Row, workdir: Path, fast_port: int, seconds: float) -> dict[str, float]:
    processes, port = sidecar_stack(workdir, f"bridge-{row.model}-{row.bridges}", fast_port,
                                    "http://127.0.0.1:9/v1", TOKEN,
                                    config_text=config(fast_port, row.bridges))
    try:
        run_wrk(port, CHAT_PATH, row.model, TOKEN, 32, min(seconds, 2.0))  # warm-up
        before = processes.cpu_seconds()
        busy = run_wrk(port, CHAT_PATH, row.model, TOKEN, 32, seconds)
        if busy.bad_responses:
            raise RuntimeError(f"{row.name}: {busy.bad_responses} failed requests "
                               f"({busy.failure_detail})")
        cpu = {f"cpu_{name}": (after - before[name]) / busy.requests * 1000
               for name, after in processes.cpu_seconds().items()}
        single = run_wrk(port, CHAT_PATH, row.model, TOKEN, 1, seconds)
        return {"rps_c32": busy.requests_per_s, "p50_c32": busy.p50_ms,
                "p99_c32": busy.p99_ms, "p50_c1": single.p50_ms, "p99_c1": single.p99_ms,
                **cpu}
    finally:
        processes.stop()


def report(table: list[Row], rounds: int, seconds: float) -> str:
    medians = {row.name: {key: statistics.median(r[key] for r in row.results) for key in KEYS}
               for row in table}
    lines = [f"## Bridged vs native: {rounds} alternating rounds, {seconds:g} s per load "
             "phase; medians", "",
             "| row | req/s c32 | p50 / p99 ms c1 | p50 / p99 ms c32 | CPU s per 1k: sidecar, "
             "Envoy |", "| --- | --- | --- | --- | --- |"]
    for name, m in medians.items():
        lines.append(f"| {name} | {m['rps_c32']:,.0f} | {m['p50_c1']:.2f} / {m['p99_c1']:.2f} "
                     f"| {m['p50_c32']:.2f} / {m['p99_c32']:.2f} | {m['cpu_sidecar']:.3f}, "
                     f"{m['cpu_envoy']:.3f} |")
    native, with_bridges, bridged = (medians[row.name] for row in table)
    spread = max(r["cpu_sidecar"] for r in table[0].results) - min(
        r["cpu_sidecar"] for r in table[0].results)
    lines += ["",
              f"- Native path with a bridging group configured: sidecar CPU "
              f"{with_bridges['cpu_sidecar'] - native['cpu_sidecar']:+.3f} s per 1k "
              f"(round-to-round spread of the plain native row: {spread:.3f}); c1 p50 "
              f"{with_bridges['p50_c1'] - native['p50_c1']:+.2f} ms.",
              f"- A bridge adds {bridged['p50_c1'] - native['p50_c1']:+.2f} ms at c1 p50, "
              f"{bridged['p99_c1'] - native['p99_c1']:+.2f} ms at c1 p99, "
              f"{(bridged['cpu_sidecar'] - native['cpu_sidecar']) * 1000:+.0f} µs of sidecar "
              f"CPU and {(bridged['cpu_envoy'] - native['cpu_envoy']) * 1000:+.0f} µs of "
              f"Envoy CPU per request; throughput at c32 "
              f"{bridged['rps_c32'] / native['rps_c32']:.2f}× native.",
              "", "Method: wrk (Debian), 1 KB chat bodies; the provider is an Envoy answering "
              "a fixed completion (OpenAI) or message (Anthropic) from a direct response."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    table = [Row("native, no bridges configured", "native", False),
             Row("native, a bridging group configured", "native", True),
             Row("bridged (Chat caller → Anthropic target)", "bridged", True)]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        try:
            wait_http(fast_port, CHAT_PATH)
            for _ in range(args.rounds):
                for row in table:
                    row.results.append(measure(row, workdir, fast_port, args.seconds))
                    time.sleep(0.5)
        finally:
            provider.stop()
    publish(report(table, args.rounds, args.seconds), args.output)
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
