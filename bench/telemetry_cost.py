"""Telemetry on versus off (issue #15): the routed request path through real Envoy and the
real sidecar (SPEC dynamic_score group), with telemetry off and with telemetry on (SQLite),
rows alternating round by round in one run, all on loopback.

Per row, as in side_by_side.py: requests/s at concurrency 32, p50/p99 latency at
concurrency 1 and 32, stream time to first event, CPU seconds per 1,000 requests of Envoy,
of the sidecar process (the request path) and of its telemetry worker process (beside it).
The noise is measured, not guessed: `--control` adds a second "off" row, and the report
sets off-vs-off (A/A) beside on-vs-off, round by round. It also checks that the "on" rows
wrote one joined row per request.

Usage:  .venv/bin/python bench/telemetry_cost.py [--rounds 3] [--seconds 5] [--control]
        [--output F]   (wrk from Debian's package must be installed)
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench_processes import TOKEN, sidecar_stack
from mode_runner import publish
from side_by_side import CHAT_PATH, EVENT_SPACING_MS, STREAM_EVENTS, Row, Started, alternate

from sidecar.devstack.harness import ProviderThread

KEYS = ("rps_c32", "p50_c1", "p99_c1", "p50_c32", "p99_c32", "ttfb_p50", "cpu_sidecar",
        "cpu_envoy", "cpu_worker", "cpu_all")


def rows(fast_port: int, drip: ProviderThread, workdir: Path, control: bool) -> list[Row]:
    drip_url = drip.base_url("drip")

    def sidecar(telemetry: str) -> Callable[[Path], Started]:
        def start(work: Path) -> Started:
            processes, port = sidecar_stack(work, "dynamic_score", fast_port, drip_url, TOKEN,
                                            extra_config=telemetry,
                                            apart=frozenset({"sidecar"}))
            return Started(processes, port, "adaptive-agent", port, CHAT_PATH, "stream-group")
        return start

    db = workdir / "telemetry.db"
    table = [Row("telemetry off", sidecar("")),
             Row("telemetry on (SQLite)", sidecar(f"telemetry: {{sqlite_path: '{db}'}}\n"),
                 settle=Settle(db))]
    if control:
        table.append(Row("telemetry off (control)", sidecar("")))
    return table


def rows_written(db_path: Path, expected: int, timeout_s: float = 120.0) -> int:
    """The telemetry database's request rows once there are `expected` of them, or as many
    as there are after `timeout_s` (the worker runs niced: under load it trails)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db_path) as db:
            count = db.execute("SELECT count(*) FROM request_rows").fetchone()[0]
        if count >= expected or time.monotonic() >= deadline:
            return count
        time.sleep(0.2)


class Settle:
    """After an 'on' row's measurements: wait until the worker has written a row for every
    request of the phase (it runs niced, so under load it may trail), then take its whole
    CPU time per row — also what it spent after the busy phase."""

    def __init__(self, db: Path) -> None:
        self._db = db
        self._seen = 0

    def __call__(self, started: Started, figures: dict[str, float]) -> None:
        expected = self._seen + int(figures["requests"])
        count = rows_written(self._db, expected)
        rows = count - self._seen
        self._seen = count
        figures["rows_missing"] = float(expected - count)
        figures["cpu_worker_per_row"] = (started.processes.cpu_seconds()["sidecar_children"]
                                         / max(rows, 1) * 1000)


def with_totals(result: dict[str, float]) -> dict[str, float]:
    """The worker's CPU (the sidecar's child process), and everything the stack used."""
    worker = result.get("cpu_sidecar_children", 0.0)
    return {**result, "cpu_worker": worker,
            "cpu_all": result["cpu_sidecar"] + worker + result["cpu_envoy"]}


def spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0


# Figures where more is better; for the others (latency, CPU) less is better.
_HIGHER_IS_BETTER = {"rps_c32"}


def worse(key: str, a: list[float], b: list[float]) -> int:
    """Rounds in which `b` did worse than `a` (they ran back to back)."""
    return sum((y < x) if key in _HIGHER_IS_BETTER else (y > x) for x, y in zip(a, b, strict=True))


def ratio(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.median(a), statistics.median(b)
    return mb / ma if ma else float("nan")


def report(table: list[Row], rounds: int, seconds: float, written: int) -> str:
    """Medians, and the rounds paired (each round ran every row, back to back, starting one
    row further on each round): an effect that shows in every pair is not noise, whatever
    the spread between rounds. With a control row, off vs off (A/A) shows what noise alone
    does to the same figures, its "rounds worse" count included."""
    off, on, *control = table
    head = "| figure | off median (spread) | on median (spread) | on / off |"
    rule = "| --- | --- | --- | --- |"
    if control:
        head += " control / off (A/A) | rounds where control is worse (A/A) |"
        rule += " --- | --- |"
    lines = [f"## Telemetry on vs off: {rounds} alternating rounds, {seconds:g} s per load "
             "phase", "", head + " rounds where on is worse | on − off per round |",
             rule + " --- | --- |"]
    for key in KEYS:
        a = [r[key] for r in off.results]
        b = [r[key] for r in on.results]
        pairs = [y - x for x, y in zip(a, b, strict=True)]
        line = (f"| {key} | {statistics.median(a):.3f} (±{spread(a):.3f}) | "
                f"{statistics.median(b):.3f} (±{spread(b):.3f}) | {ratio(a, b):.3f} |")
        if control:
            c = [r[key] for r in control[0].results]
            line += f" {ratio(a, c):.3f} | {worse(key, a, c)} of {len(c)} |"
        lines.append(line + f" {worse(key, a, b)} of {len(pairs)} | "
                     f"{', '.join(f'{d:+.3f}' for d in pairs)} |")
    missing = sum(r.get("rows_missing", 0.0) for r in on.results)
    per_row = statistics.median(r["cpu_worker_per_row"] for r in on.results)
    lines += ["",
              f"Rows written by the 'on' sidecars: {written:,} request rows; requests "
              f"without a row once the worker had caught up: {missing:,.0f}. The worker's "
              f"whole CPU time (also after the busy phase, while it caught up): "
              f"{per_row:.3f} s per 1,000 rows (median of the rounds).",
              "CPU figures are seconds per 1,000 requests: `cpu_sidecar` is the sidecar "
              "process (the request path), `cpu_worker` its telemetry worker process, "
              "`cpu_all` both and Envoy; latencies in ms. Streams: "
              f"{STREAM_EVENTS} events {EVENT_SPACING_MS:g} ms apart."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--control", action="store_true",
                        help="a second 'off' row, for the off-vs-off noise")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    def written(workdir: Path) -> int:
        with sqlite3.connect(workdir / "telemetry.db") as db:
            return db.execute("SELECT count(*) FROM request_rows").fetchone()[0]

    table, count = alternate(
        lambda port, drip, workdir: rows(port, drip, workdir, args.control),
        args.rounds, args.seconds, args.streams, written)
    assert isinstance(count, int)
    for row in table:
        row.results = [with_totals(result) for result in row.results]
    publish(report(table, args.rounds, args.seconds, count), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
