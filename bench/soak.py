"""Soak (issue 40, "long runs as a test"): the real stack (`sidecar up`: the sidecar and
Envoy) under mixed traffic from the official OpenAI and Anthropic SDKs for `--minutes`
(default 30) at production speed, with `GET /ready` polled every 200 ms: the same driver as
the short CI run (tests/e2e/test_soak.py, sidecar/devstack/soak.py), without its time
scaling. Reports requests by outcome, `/ready` answers other than 200, Envoy's health checks
of the sidecar, RSS of the sidecar and of Envoy per minute (start, end, trend), the gRPC
server's counters of what its limits closed or refused, Envoy's counters of its
connections to the sidecar, and every log line at WARNING or above.

Where `bench/memory_soak.py` pushes ~1,000 requests/s of one kind through wrk to show the
routing stores are bounded, this one sends a few per second of every kind a gateway sees
(faults, fallbacks, hang-ups, both dialects) and watches the long-lived parts: readiness,
Envoy's connections to the sidecar, the limits' counters and the logs.

Usage:  .venv/bin/python bench/soak.py [--minutes 30] [--time-scale 1] [--workers 6]
        [--output bench/results/soak.md]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from mode_runner import publish

from sidecar.devstack.soak import LIMIT_COUNTERS, SoakPlan, SoakReport, run_soak


def _trend_mb_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB), in MB per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if not spread:
        return 0.0
    return 3600 * sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def render(report: SoakReport, load: tuple[str, str]) -> str:
    plan, tally = report.plan, report.tally
    samples = report.samples
    later = [s for s in samples if s.at_s >= report.wall_s / 2]
    requests = tally.total()
    lines = [
        f"## Soak: {report.wall_s / 60:.1f} min at time scale {plan.time_scale:g}, "
        f"{requests:,} requests", "",
        f"Traffic {plan.seconds / 60:.1f} min in two halves around a quiet "
        f"{plan.quiet_s:.0f} s (longer than the gRPC server's idle timeout, "
        f"{plan.limits.idle_timeout:.0f} s); {plan.workers} SDK callers, "
        f"{requests / plan.seconds:.1f} requests/s. Load average (1, 5, 15 min) at start "
        f"{load[0]}, at end {load[1]} (2 cores, shared with other work).", "",
        f"- requests: {tally.total('ok'):,} answered (rescued faults included), "
        f"{tally.total('error_as_expected'):,} errors as expected (JSON in the caller's "
        f"dialect), {tally.total('cancelled'):,} hung up by the caller as planned, "
        f"**{tally.total('unexpected')} unexpected**",
        f"- `GET /ready`: {report.ready_polls:,} polls, **"
        f"{sum(report.ready_failures.values())} not 200** "
        f"{dict(report.ready_failures) or ''}"
        + "".join(f"; at {at:.1f} s: {what}" for at, what in report.ready_first_failures),
        f"- Envoy's health checks of the sidecar: {report.health_checks:,} "
        f"({report.envoy_grew('health_check.failure')} failed), "
        f"{report.health_checks / 100:.0f} x `max_unauthenticated_calls`",
        f"- sidecar RSS: {samples[0].sidecar_rss_mb:.1f} MB at start, "
        f"{samples[-1].sidecar_rss_mb:.1f} MB at end, trend over the second half "
        f"{_trend_mb_per_hour([(s.at_s, s.sidecar_rss_mb) for s in later]):+.1f} MB/h",
        f"- Envoy RSS: {samples[0].envoy_rss_mb:.1f} MB at start, "
        f"{samples[-1].envoy_rss_mb:.1f} MB at end, trend over the second half "
        f"{_trend_mb_per_hour([(s.at_s, s.envoy_rss_mb) for s in later]):+.1f} MB/h",
        "- gRPC server counters (grew during the run): " + ", ".join(
            f"`{name}` {report.grew(name):.0f}" for name in (*LIMIT_COUNTERS, "idle_closed")),
        "- Envoy's connections to the sidecar: " + ", ".join(
            f"`{name}` {report.envoy_grew(name):,}" for name in (
                "upstream_cx_total", "upstream_cx_destroy_remote",
                "upstream_cx_destroy_local", "upstream_cx_idle_timeout",
                "upstream_cx_protocol_error", "upstream_cx_tx_bytes_total")),
        f"- log lines at WARNING or above: {len(report.findings)} "
        f"({len(report.unexplained)} unexplained)",
    ]
    for finding in report.findings[:20]:
        lines.append(f"  - {finding.source} {finding.level}: `{finding.text[:200]}`"
                     + (f" ({finding.reason})" if finding.reason else ""))
    lines += ["", "| kind | outcomes |", "| --- | --- |"]
    by_kind: dict[str, list[str]] = {}
    for (kind, outcome), n in sorted(tally.outcomes.items()):
        by_kind.setdefault(kind, []).append(f"{outcome} {n:,}")
    lines += [f"| {kind} | {', '.join(outcomes)} |" for kind, outcomes in by_kind.items()]
    if tally.reasons:
        lines += ["", "Unexpected:"] + [f"- {n} x {why}" for why, n in tally.reasons.items()]
    lines += ["", "| minute | sidecar RSS MB | Envoy RSS MB |", "| --- | --- | --- |"]
    shown = -1
    for sample in samples:
        minute = int(sample.at_s // 60)
        if minute > shown:
            shown = minute
            lines.append(f"| {minute} | {sample.sidecar_rss_mb:.1f} | "
                         f"{sample.envoy_rss_mb:.1f} |")
    last = samples[-1]
    lines.append(f"| end ({last.at_s / 60:.1f}) | {last.sidecar_rss_mb:.1f} | "
                 f"{last.envoy_rss_mb:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="the whole run, the quiet phase included")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="SIDECAR_TEST_TIME_SCALE for the stack (1: production speed)")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    quiet = SoakPlan(1, args.time_scale).quiet_s
    plan = SoakPlan(seconds=max(60.0, args.minutes * 60 - quiet), time_scale=args.time_scale,
                    workers=args.workers, sample_every_s=10.0,
                    ready_every_s=0.2 / args.time_scale)
    start_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        report = run_soak(Path(tmp), plan)
    end_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(ran {(time.time() - started) / 60:.1f} min)")
    publish(render(report, (start_load, end_load)), args.output)
    return 0 if not report.tally.total("unexpected") and not report.ready_failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
