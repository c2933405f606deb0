"""Benchmark: what a shadow policy costs (issue #31: the decision path with a shadow within
10 % of one without).

In process, with real upb messages and no network, as routing_overhead.py measures the
sidecar's per-request work: the SPEC sample's dynamic_score group (1 KB chat bodies)
without a shadow, and with a shadow policy of other weights and another score term, rounds
alternating. Reported apart: the decision path (both ext_proc messages, the shadow only
offered), and the deferred work the shadow adds later on the same event loop (its own
decision and comparison, per shadowed request), so the total CPU is visible too.

Usage:  .venv/bin/python bench/shadow_cost.py [--requests 5000] [--rounds 8]
            [--output bench/results/shadow_cost.md]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from in_process import chat_wire, one_request
from routing_overhead import chat_body

from sidecar.config.loading import load_config_data
from sidecar.extproc.processor import ExternalProcessor
from sidecar.gateway import Gateway, Runtime
from sidecar.operations.process import keep_large_buffers_in_heap

TOKEN = "bench-token"
SPEC = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "spec_sample.yaml"
SHADOW = {"weights": {"baseten/gpt-oss-120b": 20, "minimax/m3": 60, "openai/gpt-5.4-nano": 20},
          "routing_policy": {"dynamic_score": {
              "min_observations": 20,
              "score_terms": [{"name": "cheapest", "expression": "cost_score"}]}}}


def processor(shadow: bool) -> tuple[ExternalProcessor, Gateway]:
    sample = yaml.safe_load(SPEC.read_text())
    group = sample["models"]["adaptive-agent"]
    for target in group["targets"]:
        target["pricing"] = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
    if shadow:
        group["shadow"] = SHADOW
    data = {"providers": {name: {"base_url": "http://127.0.0.1:9/v1"}
                          for name in ("baseten", "minimax", "openai")},
            "callers": [{"name": "bench",
                         "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}],
            "models": {"bench-group": group}}
    gateway = Gateway(Runtime(load_config_data(data), {}))
    return ExternalProcessor(gateway), gateway


def measure(requests: int, rounds: int) -> dict[str, list[float]]:
    keep_large_buffers_in_heap()
    messages = chat_wire(chat_body(1024), TOKEN)
    plain, _ = processor(False)
    shadowed, gateway = processor(True)
    figures: dict[str, list[float]] = {"without": [], "with": [], "deferred": []}
    for proc in (plain, shadowed):  # warm both
        for _ in range(500):
            one_request(proc, messages)
    assert gateway.shadows is not None
    while gateway.shadows.drain():
        pass
    for round_ in range(rounds):
        order = [("without", plain), ("with", shadowed)]
        for name, proc in order if round_ % 2 == 0 else reversed(order):
            started = time.process_time()
            for _ in range(requests):
                one_request(proc, messages)
                if name == "with" and gateway.shadows.pending >= 4000:
                    break  # never measured: the queue holds a round's offers
            figures[name].append((time.process_time() - started) / requests * 1e6)
            if name == "with":
                pending = gateway.shadows.pending
                started = time.process_time()
                while gateway.shadows.drain():
                    pass
                figures["deferred"].append((time.process_time() - started) / pending * 1e6)
    return figures


def report(figures: dict[str, list[float]], requests: int) -> str:
    med = {name: statistics.median(values) for name, values in figures.items()}
    ratio = statistics.median(w / o for w, o in zip(figures["with"], figures["without"],
                                                    strict=True))
    return "\n".join([
        "# What a shadow policy costs (in process, 1 KB chat, the SPEC group)", "",
        f"{len(figures['with'])} rounds of {requests} requests, alternating; µs of CPU per "
        "request, median of rounds.", "",
        "| path | µs per request |", "| --- | ---: |",
        f"| decision path, no shadow | {med['without']:.1f} |",
        f"| decision path, with a shadow (offered only) | {med['with']:.1f} |",
        f"| deferred shadow decision and comparison, per shadowed request | "
        f"{med['deferred']:.1f} |", "",
        f"Decision path with / without, median of paired rounds: **{ratio:.3f}** (goal ≤ "
        "1.10). Total CPU with the deferred work: "
        f"{(med['with'] + med['deferred']) / med['without']:.2f} × (bounded by "
        "`shadow.sample_percent`).", ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    text = report(measure(args.requests, args.rounds), args.requests)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
