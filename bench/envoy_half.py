"""Benchmark: issue #32's final side-by-side table — Envoy alone against Envoy + sidecar for
the SPEC group under `dynamic_score` and `weighted`, telemetry off and on (SQLite), with 1
and 2 sidecar processes, each row's ratios against Envoy alone from the same run.

Rows alternate round by round as side_by_side.py runs them (wrk at concurrency 32 and 1
with 1 KB chat bodies, a distinct conversation each; streams to the demo provider for the
time to first event). Every sidecar row has provider keys in Envoy (the credential
injector is in), as a real deployment has. The sidecar's CPU includes every sidecar
process and their telemetry workers (counted per request over the busy phase; with
telemetry on, the worker's CPU is taken after it has written every row of the phase).

Usage:  .venv/bin/python bench/envoy_half.py [--rounds 3] [--seconds 4] [--streams 20]
            [--output bench/results/envoy_half.md]
Loopback only; every process it starts it also stops. wrk from Debian's package.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from bench_processes import TOKEN, sidecar_stack, start_envoy_direct
from envoy_pieces import KEY_ENV, config_with_keys
from mode_runner import publish
from side_by_side import CHAT_PATH, Row, Started, alternate
from telemetry_cost import rows_written

from sidecar.devstack.harness import ProviderThread

# Issue #32's targets, as ratios to Envoy alone in the same run.
MAX_TOTAL_CPU = 4.0
MAX_SIDECAR_CPU = 2.0
MIN_THROUGHPUT = 0.35
MAX_ADDED_P50_MS = 0.5
MAX_ADDED_P99_MS = 1.0
MAX_ADDED_FIRST_EVENT_MS = 0.5


class WrittenRows:
    """With telemetry on: wait until the workers have a row for every request of the row's
    phases (they run niced, so under load they trail), then count their whole CPU time per
    row written instead of what they happened to spend during the busy phase."""

    def __init__(self, db: Path) -> None:
        self._db = db
        self._seen = 0

    def __call__(self, started: Started, figures: dict[str, float]) -> None:
        expected = self._seen + int(figures["requests"])
        count = rows_written(self._db, expected)
        written, self._seen = count - self._seen, count
        figures["rows_missing"] = float(expected - count)
        cpu = started.processes.cpu_seconds()
        for key in [k for k in figures if k.endswith("_children")]:
            figures[key] = cpu[key.removeprefix("cpu_")] / max(written, 1) * 1000


def rows(fast_port: int, drip: ProviderThread, workdir: Path) -> list[Row]:
    drip_url = drip.base_url("drip")
    drip_path = "/drip" + CHAT_PATH

    def envoy(work: Path) -> Started:
        processes, port = start_envoy_direct(work, fast_port, drip.server.port)
        return Started(processes, port, "m", port, drip_path, "drip-model")

    def sidecar(strategy: str, telemetry: Path | None, processes: int
                ) -> Callable[[Path], Started]:
        def start(work: Path) -> Started:
            text = config_with_keys(fast_port, drip_url, TOKEN, strategy)
            extra = f"telemetry: {{sqlite_path: '{telemetry}'}}\n" if telemetry else ""
            running, port = sidecar_stack(work, strategy, fast_port, drip_url, "",
                                          processes=processes, config_text=text,
                                          extra_config=extra,
                                          apart=frozenset({"sidecar", "sidecar2"}))
            return Started(running, port, "adaptive-agent", port, CHAT_PATH, "stream-group")
        return start

    table = [Row("Envoy alone", envoy)]
    for strategy in ("dynamic_score", "weighted"):
        for telemetry in (False, True):
            db = workdir / f"telemetry-{strategy}.db" if telemetry else None
            table.append(Row(f"{strategy}, telemetry {'on' if telemetry else 'off'}, "
                             "1 process", sidecar(strategy, db, 1),
                             settle=WrittenRows(db) if db else None))
    for telemetry in (False, True):
        db = workdir / "telemetry-2.db" if telemetry else None
        table.append(Row(f"dynamic_score, telemetry {'on' if telemetry else 'off'}, "
                         "2 processes", sidecar("dynamic_score", db, 2),
                         settle=WrittenRows(db) if db else None))
    return table


def _us(m: dict[str, float], *prefixes: str) -> float:
    """CPU µs per request of the named processes (and their children, e.g. the telemetry
    worker); `cpu_*` figures are seconds per 1,000 requests."""
    return sum(value for key, value in m.items()
               if any(key.startswith(f"cpu_{p}") for p in prefixes)) * 1000


def report(table: list[Row], rounds: int, seconds: float) -> str:
    medians = {row.name: {key: statistics.median(r[key] for r in row.results)
                          for key in row.results[0]} for row in table if row.results}
    alone = medians["Envoy alone"]
    envoy_alone = _us(alone, "envoy")
    lines = [f"## Envoy alone vs Envoy + sidecar: {rounds} alternating rounds, {seconds:g} s "
             "per load phase; medians", "",
             "| row | req/s c32 | × Envoy alone req/s | Envoy µs/req | sidecar µs/req | "
             "total CPU × Envoy alone | sidecar CPU × Envoy alone | added c1 p50 / p99 ms | "
             "added first event ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    misses: dict[str, list[str]] = {}
    for name, m in medians.items():
        envoy_us, sidecar_us = _us(m, "envoy"), _us(m, "sidecar")
        figures = {
            "throughput": m["rps_c32"] / alone["rps_c32"],
            "total": (envoy_us + sidecar_us) / envoy_alone,
            "sidecar": sidecar_us / envoy_alone,
            "p50": m["p50_c1"] - alone["p50_c1"], "p99": m["p99_c1"] - alone["p99_c1"],
            "first": m["ttfb_p50"] - alone["ttfb_p50"]}
        lines.append(
            f"| {name} | {m['rps_c32']:,.0f} | {figures['throughput']:.2f} | {envoy_us:.0f} | "
            f"{sidecar_us:.0f} | {figures['total']:.2f} | {figures['sidecar']:.2f} | "
            f"{figures['p50']:+.2f} / {figures['p99']:+.2f} | {figures['first']:+.2f} |")
        if name == "Envoy alone":
            continue
        checks = {"total CPU": figures["total"] <= MAX_TOTAL_CPU,
                  "sidecar CPU": figures["sidecar"] <= MAX_SIDECAR_CPU,
                  "throughput": figures["throughput"] >= MIN_THROUGHPUT,
                  "c1 p50": figures["p50"] <= MAX_ADDED_P50_MS,
                  "c1 p99": figures["p99"] <= MAX_ADDED_P99_MS,
                  "first event": figures["first"] <= MAX_ADDED_FIRST_EVENT_MS}
        misses[name] = [check for check, met in checks.items() if not met]
    lines += ["", f"Targets (issue #32): total CPU ≤ {MAX_TOTAL_CPU:g}× Envoy alone's, the "
              f"sidecar's ≤ {MAX_SIDECAR_CPU:g}×, req/s ≥ {MIN_THROUGHPUT:g}×, added c1 p50 ≤ "
              f"+{MAX_ADDED_P50_MS:g} ms and p99 ≤ +{MAX_ADDED_P99_MS:g} ms, added first "
              f"event ≤ +{MAX_ADDED_FIRST_EVENT_MS:g} ms.", ""]
    lines += [f"- {name}: " + (f"misses {', '.join(missed)}" if missed else "meets every target")
              for name, missed in misses.items()]
    lines += ["", f"Envoy alone: {envoy_alone:.0f} µs of Envoy CPU per request. The sidecar's "
              "CPU is every sidecar process with its telemetry worker."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    os.environ.setdefault(KEY_ENV, "bench-provider-key")  # Envoy reads it (SDS)
    table, _ = alternate(rows, args.rounds, args.seconds, args.streams)
    publish(report(table, args.rounds, args.seconds), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
