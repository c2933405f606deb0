"""Side-by-side benchmark (issue #7): the fake provider directly, Envoy alone (the physical
limit), Envoy + sidecar (SPEC dynamic_score group, and weighted), and LiteLLM's proxy, in one
run, rows alternating round by round, all on loopback.

Per row: requests/s at concurrency 32 (wrk, 1 KB chat bodies, a distinct conversation per
request), p50/p99 latency at concurrency 1 and 32, streaming time to first event and the
inter-event delay added to a 20-event stream (10 ms apart at the provider), CPU seconds per
1,000 requests of every process of the row, and the sidecar's peak RSS. Writes a Markdown
table with ratios against Envoy direct and LiteLLM, computed from the same run.

The JSON provider is an Envoy answering a fixed OpenAI completion (with usage) from a
direct response: a fast fake provider, so provider time is not what the rows compare. The
streaming provider is the project's demo provider (Python), spacing its events.

LiteLLM (latest from PyPI) is installed into its own venv (`--litellm-venv`, created on
first use) and run with `simple-shuffle` and `latency-based-routing`, 1 and 2 workers,
routing a two-deployment model group to the same providers.

Usage:  .venv/bin/python bench/side_by_side.py [--rounds 2] [--seconds 5] [--output F]
        [--skip-litellm]   (wrk from Debian's package must be installed)
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench_processes import (
    TOKEN,
    Processes,
    fast_provider,
    litellm_command,
    sidecar_stack,
    start_envoy_direct,
    wait_http,
)
from mode_runner import publish
from stream_probe import StreamFigures, probe_streams
from wrk_load import run_wrk

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import Behaviour, FakeProvider

STREAM_EVENTS = 20
EVENT_SPACING_MS = 10.0
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Started:
    """A row's running processes and where its JSON and streaming requests go."""

    processes: Processes
    port: int
    model: str
    stream_port: int
    stream_path: str
    stream_model: str


@dataclass
class Row:
    name: str
    start: Callable[[Path], Started]
    results: list[dict[str, float]] = field(default_factory=list)
    # Runs after the measurements, before the processes stop; may add figures.
    settle: Callable[[Started, dict[str, float]], None] | None = None


def measure(row: Row, workdir: Path, seconds: float, streams: int) -> dict[str, float]:
    started = row.start(workdir)
    processes, port, model = started.processes, started.port, started.model

    def stream(count: int) -> StreamFigures:
        return probe_streams(started.stream_port, started.stream_path, started.stream_model,
                             TOKEN, count)

    try:
        warm = run_wrk(port, CHAT_PATH, model, TOKEN, 32, min(seconds, 2.0))  # warm-up
        stream(3)
        before = processes.cpu_seconds()
        busy = run_wrk(port, CHAT_PATH, model, TOKEN, 32, seconds)
        cpu = {name: (after - before[name]) / busy.requests * 1000
               for name, after in processes.cpu_seconds().items()}
        if busy.bad_responses:
            raise RuntimeError(f"{row.name}: {busy.bad_responses} failed requests "
                               f"({busy.failure_detail})")
        single = run_wrk(port, CHAT_PATH, model, TOKEN, 1, seconds)
        streamed = stream(streams)
        figures = {
            "rps_c32": busy.requests_per_s, "p50_c32": busy.p50_ms, "p99_c32": busy.p99_ms,
            "p50_c1": single.p50_ms, "p99_c1": single.p99_ms,
            "ttfb_p50": streamed.ttfb_p50_ms, "ttfb_p99": streamed.ttfb_p99_ms,
            "gap_mean": streamed.mean_gap_ms, "wrk_cpu_per_1k": busy.cpu_s / busy.requests * 1000,
            "rss_mb": processes.peak_rss_mb("sidecar"),
            "requests": warm.requests + 3 + busy.requests + single.requests + streams,
        }
        figures.update({f"cpu_{name}": value for name, value in cpu.items()})
        if row.settle is not None:
            row.settle(started, figures)
        return figures
    finally:
        processes.stop()


def rows(fast_port: int, drip: ProviderThread, litellm_venv: Path | None) -> list[Row]:
    drip_url = drip.base_url("drip")
    drip_path = "/drip" + CHAT_PATH

    def direct(_: Path) -> Started:
        return Started(Processes(), fast_port, "m", drip.server.port, drip_path, "drip-model")

    def envoy(workdir: Path) -> Started:
        processes, port = start_envoy_direct(workdir, fast_port, drip.server.port)
        return Started(processes, port, "m", port, drip_path, "drip-model")

    def sidecar(strategy: str) -> Callable[[Path], Started]:
        def start(workdir: Path) -> Started:
            processes, port = sidecar_stack(workdir, strategy, fast_port, drip_url, TOKEN)
            return Started(processes, port, "adaptive-agent", port, CHAT_PATH, "stream-group")
        return start

    def litellm(strategy: str, workers: int) -> Callable[[Path], Started]:
        def start(workdir: Path) -> Started:
            assert litellm_venv is not None
            processes, port = litellm_command(litellm_venv, workdir, strategy, workers,
                                              fast_port, drip_url, TOKEN)
            return Started(processes, port, "g", port, CHAT_PATH, "s")
        return start

    table = [
        Row("provider direct", direct),
        Row("Envoy direct", envoy),
        Row("Envoy + sidecar (dynamic_score)", sidecar("dynamic_score")),
        Row("Envoy + sidecar (weighted)", sidecar("weighted")),
    ]
    if litellm_venv is not None:
        for strategy in ("simple-shuffle", "latency-based-routing"):
            for workers in (1, 2):
                table.append(Row(f"LiteLLM {strategy}, {workers} worker"
                                 f"{'s' if workers > 1 else ''}", litellm(strategy, workers)))
    return table


def ensure_litellm(venv: Path) -> Path:
    litellm = venv / "bin" / "litellm"
    if not litellm.exists():
        print(f"installing LiteLLM (latest) into {venv} …", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
                       check=True)
    return venv


def report(table: list[Row], rounds: int, seconds: float, litellm_version: str | None) -> str:
    medians = {row.name: {key: statistics.median(r[key] for r in row.results)
                          for key in row.results[0]} for row in table}
    direct_gap = medians["provider direct"]["gap_mean"]
    lines = [
        f"## Side by side: {rounds} alternating rounds, {seconds:g} s per load phase; medians",
        "",
        "| row | req/s c32 | p50 / p99 ms c1 | p50 / p99 ms c32 | stream TTFB p50 / p99 ms "
        "| added inter-event ms | CPU s per 1k req | sidecar peak RSS MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in medians.items():
        cpu = ", ".join(f"{key[4:]} {value:.2f}" for key, value in m.items()
                        if key.startswith("cpu_")) or "—"
        rss = f"{m['rss_mb']:.0f}" if m["rss_mb"] else "—"
        lines.append(
            f"| {name} | {m['rps_c32']:,.0f} | {m['p50_c1']:.2f} / {m['p99_c1']:.2f} | "
            f"{m['p50_c32']:.2f} / {m['p99_c32']:.2f} | {m['ttfb_p50']:.2f} / "
            f"{m['ttfb_p99']:.2f} | {m['gap_mean'] - direct_gap:+.2f} | {cpu} | {rss} |")
    lines += ["", *ratios(medians), "", "Method: wrk (Debian) with a Lua script posting 1 KB "
              "chat bodies, a distinct conversation per request; `wrk` CPU per 1k requests: "
              + ", ".join(f"{name} {m['wrk_cpu_per_1k']:.2f}" for name, m in medians.items())
              + f". Streams: {STREAM_EVENTS} events {EVENT_SPACING_MS:g} ms apart at the "
              "provider; added inter-event delay is the mean gap minus provider direct's."]
    if litellm_version:
        lines.append(f"LiteLLM {litellm_version}.")
    return "\n".join(lines) + "\n"


def ratios(medians: dict[str, dict[str, float]]) -> list[str]:
    envoy = medians["Envoy direct"]
    out = ["Ratios (same run):", ""]
    for name in ("Envoy + sidecar (dynamic_score)", "Envoy + sidecar (weighted)"):
        m = medians[name]
        out.append(f"- {name}: {m['rps_c32'] / envoy['rps_c32']:.2f}× Envoy direct's "
                   f"throughput; added latency at c1 p50 "
                   f"{m['p50_c1'] - envoy['p50_c1']:+.2f} ms, p99 "
                   f"{m['p99_c1'] - envoy['p99_c1']:+.2f} ms; added stream TTFB p50 "
                   f"{m['ttfb_p50'] - envoy['ttfb_p50']:+.2f} ms")
        litellm = medians.get("LiteLLM simple-shuffle, 1 worker")
        if litellm:
            out.append(f"  - vs LiteLLM simple-shuffle with 1 worker: "
                       f"{m['rps_c32'] / litellm['rps_c32']:.1f}× the throughput")
    return out


def alternate(make_rows: Callable[[int, ProviderThread, Path], list[Row]], rounds: int,
              seconds: float, streams: int,
              finish: Callable[[Path], object] = lambda _workdir: None,
              on_error: Callable[[Row, Exception], None] | None = None
              ) -> tuple[list[Row], object]:
    """Start the fast provider and the streaming demo provider, measure the rows round by
    round (alternating), then `finish(workdir)` while the work folder still exists. Each
    round starts one row further on (A B C, B C A, C A B, ...): a machine that speeds up
    or slows down within a round favours no row. With `on_error`, a row that fails is
    reported there and the run goes on (the row then has fewer results)."""
    text = " ".join(f"w{i}" for i in range(STREAM_EVENTS - 4))  # + role, stop, usage, DONE
    drip = FakeProvider("drip", behaviour=Behaviour(
        inter_event_delay_s=EVENT_SPACING_MS / 1000, text=text))
    with ProviderThread([drip]) as drip_server, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        try:
            wait_http(fast_port, CHAT_PATH)
            table = make_rows(fast_port, drip_server, workdir)
            for round_ in range(rounds):
                first = round_ % len(table)
                for row in table[first:] + table[:first]:
                    try:
                        row.results.append(measure(row, workdir, seconds, streams))
                    except Exception as exc:
                        if on_error is None:
                            raise
                        on_error(row, exc)
                    time.sleep(0.5)
        finally:
            provider.stop()
        return table, finish(workdir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--litellm-venv", type=Path,
                        default=Path(__file__).parent / ".litellm-venv")
    args = parser.parse_args()
    venv = None if args.skip_litellm else ensure_litellm(args.litellm_venv)
    table, _ = alternate(lambda fast_port, drip, _workdir: rows(fast_port, drip, venv),
                         args.rounds, args.seconds, args.streams)
    version = None
    if venv is not None:
        version = subprocess.run([str(venv / "bin" / "python"), "-c",
                                  "import importlib.metadata as m; print(m.version('litellm'))"],
                                 capture_output=True, text=True).stdout.strip()
    publish(report(table, args.rounds, args.seconds, version), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
