"""The native routed path of this tree against another revision's, side by side in one run
(machines here differ from session to session, so only same-run ratios compare).

Both rows run the SPEC group (dynamic_score) through real Envoy and a sidecar process, the
bootstrap rendered and the sidecar started from the given source tree (so a change to the
Envoy half shows too); rows alternate round by round, each going first in every other
round, and the per-round ratios' range is printed beside the medians' ratio: a tree
against itself spans about ±10 % here, so a difference inside that needs more rounds. A
stream's time to its first event is measured on the demo provider's stream group. Make the
other tree with `git worktree add /tmp/old <rev>`.

Usage:  .venv/bin/python bench/versus_revision.py --old-tree /tmp/old [--new-tree T] [--rounds 4]
        [--seconds 4] [--output F]      (wrk from Debian's package must be installed)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_processes import TOKEN, fast_provider, sidecar_stack, wait_http
from mode_runner import publish
from stream_probe import probe_streams
from wrk_load import run_wrk

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import FakeProvider

CHAT_PATH = "/v1/chat/completions"
NAMES = ("req/s c32", "p50 ms c1", "p99 ms c1", "stream first event ms", "sidecar CPU s/1k",
         "Envoy CPU s/1k")
STREAMS = 100


def measure(tree: Path, workdir: Path, fast_port: int, drip_url: str,
            seconds: float) -> tuple[float, ...]:
    processes, port = sidecar_stack(workdir, "dynamic_score", fast_port, drip_url, TOKEN,
                                    tree=tree)
    try:
        run_wrk(port, CHAT_PATH, "adaptive-agent", TOKEN, 32, min(seconds, 2.0))
        before = processes.cpu_seconds()
        busy = run_wrk(port, CHAT_PATH, "adaptive-agent", TOKEN, 32, seconds)
        cpu = {k: (v - before[k]) / busy.requests * 1000
               for k, v in processes.cpu_seconds().items()}
        single = run_wrk(port, CHAT_PATH, "adaptive-agent", TOKEN, 1, seconds)
        streams = probe_streams(port, CHAT_PATH, "stream-group", TOKEN, STREAMS)
        return (busy.requests_per_s, single.p50_ms, single.p99_ms, streams.ttfb_p50_ms,
                cpu["sidecar"], cpu["envoy"])
    finally:
        processes.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, required=True)
    parser.add_argument("--new-tree", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree to compare (default: this one)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    trees = {"other revision": args.old_tree.resolve(),
             "this tree": args.new_tree.resolve()}
    results: dict[str, list[tuple[float, ...]]] = {name: [] for name in trees}
    with ProviderThread([FakeProvider("drip")]) as drip, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        try:
            wait_http(fast_port, CHAT_PATH)
            for round_number in range(args.rounds):
                # ABBA: which row goes first alternates, so neither gains by its place
                order = list(trees.items())
                for name, tree in order if round_number % 2 == 0 else order[::-1]:
                    results[name].append(measure(tree, workdir, fast_port,
                                                 drip.base_url("drip"), args.seconds))
                    time.sleep(0.5)
        finally:
            provider.stop()
    lines = [f"## {trees['this tree']} vs {trees['other revision']}: {args.rounds} alternating "
             "rounds; medians", "",
             f"| row | {' | '.join(NAMES)} |", "|---" * (len(NAMES) + 1) + "|"]
    medians = {}
    for name, rows in results.items():
        medians[name] = [statistics.median(column) for column in zip(*rows, strict=True)]
        lines.append(f"| {name} | " + " | ".join(f"{v:,.3f}" for v in medians[name]) + " |")
    old, new = medians["other revision"], medians["this tree"]
    lines += ["", "This tree / other: " + ", ".join(
        f"{name} {n / o:.2f}×" for name, o, n in zip(NAMES, old, new, strict=True))]
    # The same ratio round by round (each round's two rows ran back to back): its range is
    # this run's noise; a tree compared with itself spans about ±10 % on the shared machine.
    paired = [[n / o for o, n in zip(old_row, new_row, strict=True)]
              for old_row, new_row in zip(results["other revision"], results["this tree"],
                                          strict=True)]
    lines += ["", "Round by round (min–max): " + ", ".join(
        f"{name} {min(column):.2f}–{max(column):.2f}×"
        for name, column in zip(NAMES, zip(*paired, strict=True), strict=True))]
    publish("\n".join(lines) + "\n", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
