"""Memory soak (issue #7): the sidecar's resident memory over a long run at about 1,000
routed requests/s cycling through 10,000 distinct conversations (SPEC dynamic_score group,
affinity and observations on). The affinity store and the observation windows are bounded;
this shows it from the outside. The observation store keeps one slice per 10 s for the
longest observation window (600 s in the SPEC group), so memory grows while the first
window fills; flatness is judged after `--settle-minutes`.

Usage:  .venv/bin/python bench/memory_soak.py [--minutes 20] [--settle-minutes 11]
        [--connections 8] [--output F]
(needs Debian's `wrk`). Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from bench_processes import TOKEN, fast_provider, sidecar_stack, status_mb
from mode_runner import publish
from wrk_load import run_wrk

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import FakeProvider

CONVERSATIONS = 10_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=8,
                        help="wrk connections; about 1,000 req/s on the 2-core machine")
    parser.add_argument("--settle-minutes", type=float, default=11.0,
                        help="judge flatness after this (the first observation window)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    samples: list[tuple[float, float]] = []
    with ProviderThread([FakeProvider("drip")]) as drip, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        processes, port = sidecar_stack(workdir, "dynamic_score", fast_port,
                                        drip.base_url("drip"), TOKEN)
        try:
            pid = processes.named["sidecar"].pid
            done = threading.Event()

            def sample() -> None:
                started = time.monotonic()
                while not done.wait(10):
                    samples.append((time.monotonic() - started, status_mb(pid, "VmRSS")))

            sampler = threading.Thread(target=sample, daemon=True)
            start_rss = status_mb(pid, "VmRSS")
            sampler.start()
            # wrk cycles conversations per thread (2 threads), so 10,000 across both
            result = run_wrk(port, "/v1/chat/completions", "adaptive-agent", TOKEN,
                             args.connections, args.minutes * 60,
                             conversations=CONVERSATIONS // 2)
            done.set()
            sampler.join()
            peak = processes.peak_rss_mb("sidecar")
        finally:
            processes.stop()
            provider.stop()
    settled = ([rss for at, rss in samples if at >= args.settle_minutes * 60]
               or [rss for _, rss in samples])
    low, high = min(settled), max(settled)
    lines = [f"## Memory soak: {args.minutes:g} min, {result.requests_per_s:,.0f} req/s, "
             f"{CONVERSATIONS:,} conversations", "",
             f"Requests: {result.requests:,} ({result.bad_responses} failed"
             f"{': ' + result.failure_detail if result.failure_detail else ''}). Sidecar RSS at "
             f"start {start_rss:.1f} MB; from minute {args.settle_minutes:g} on between "
             f"{low:.1f} and {high:.1f} MB (spread {100 * (high - low) / low:.1f} %); "
             f"peak {peak:.1f} MB.",
             "", "| minute | RSS MB |", "| --- | --- |"]
    for minute in range(int(args.minutes) + 1):
        at_minute = [rss for at, rss in samples if minute * 60 <= at < (minute + 1) * 60]
        if at_minute:
            lines.append(f"| {minute} | {at_minute[-1]:.1f} |")
    publish("\n".join(lines) + "\n", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
