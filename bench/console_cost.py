"""Benchmark: what an open console costs the request path (issue 43; docs/console.md).

One `sidecar up` stack (real Envoy, real sidecar, telemetry to SQLite) in front of a fake
provider, measured in alternating rounds with the console closed and with a browser's
worth of refreshing open: every second, each of the four pages (Now, Decisions, Usage
and cost, Fallbacks and errors) fetched once — four times what one open tab costs. The
same two workloads as the other cost benchmarks:

- streams at concurrency 1: the caller's time to the first SSE event on the raw socket
  (bench/stream_probe.py), the provider sending 20 events 5 ms apart;
- JSON requests from 8 concurrent callers: p50 latency and requests/s;

and the sidecar's CPU per request (the console's pages are built in the sidecar's
process: copied on its event loop, formatted on worker threads).

Usage:  PYTHONPATH=.:bench .venv/bin/python bench/console_cost.py [--rounds 4]
            [--streams 40] [--requests 240] [--output bench/results/console_cost.md]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
from mode_runner import cpu_seconds, publish
from shadow_traffic_cost import json_load
from stream_probe import probe_streams

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import Behaviour, FakeProvider

TOKEN = "shadow-traffic-bench"  # json_load's caller
PAGES = ("now", "decisions", "usage?period=1h", "errors?period=1h")
MODES = ("closed", "refreshing")


def config_text(url: str, db: Path) -> str:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    return (f"providers:\n  live: {{base_url: '{url}', credential: null}}\n"
            f"callers: [{{name: bench, token_sha256: {digest}}}]\n"
            f"telemetry: {{sqlite_path: '{db}'}}\n"
            "models:\n  console:\n    strategy: dynamic_score\n    targets:\n"
            "      - {provider: live, model_ref: a, weight: 2, "
            "pricing: {input_per_mtok: 1, output_per_mtok: 2}}\n"
            "      - {provider: live, model_ref: b, weight: 1, "
            "pricing: {input_per_mtok: 2, output_per_mtok: 4}}\n")


class Refresher:
    """A console left open: every page fetched once a second, until stopped."""

    def __init__(self, admin: str) -> None:
        self._admin = admin
        self._stop = threading.Event()
        self.pages = 0
        self.slowest_s = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Refresher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                for page in PAGES:
                    began = time.perf_counter()
                    client.get(f"{self._admin}/console/{page}").raise_for_status()
                    self.slowest_s = max(self.slowest_s, time.perf_counter() - began)
                    self.pages += 1
                self._stop.wait(max(0.0, 1.0 - (time.perf_counter() - started)))


def run(rounds: int, streams: int, requests: int) -> tuple[dict, dict]:
    fake = FakeProvider("live", behaviour=Behaviour(inter_event_delay_s=0.005))
    figures: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    console: dict[str, float] = {"pages": 0, "slowest_s": 0.0}
    with ProviderThread([fake]) as providers, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(config_text(providers.base_url("live"), Path(tmp) / "t.db"))
        up = UpProcess(["--config", str(config)], log_path=Path(tmp) / "up.log")
        with up.running():
            admin = f"http://127.0.0.1:{up.admin_http_port}"
            probe_streams(up.listen_port, "/v1/chat/completions", "console", TOKEN, 3)
            json_load(up.listen_port, "console", 80)  # rows for the usage pages to read
            for _ in range(rounds):
                for mode in MODES:
                    refresher = Refresher(admin) if mode == "refreshing" else None
                    if refresher is not None:
                        refresher.__enter__()
                        time.sleep(1.5)  # the first full refresh is under way
                    cpu = cpu_seconds(up.process.pid)
                    stream = probe_streams(up.listen_port, "/v1/chat/completions", "console",
                                           TOKEN, streams)
                    p50, rate = json_load(up.listen_port, "console", requests)
                    used = cpu_seconds(up.process.pid) - cpu
                    if refresher is not None:
                        refresher.__exit__()
                        console["pages"] += refresher.pages
                        console["slowest_s"] = max(console["slowest_s"], refresher.slowest_s)
                    row = figures[mode]
                    for name, value in (
                            ("ttfe_p50_ms", stream.ttfb_p50_ms),
                            ("ttfe_p95_ms", sorted(stream.ttfbs_ms)[int(0.95 * streams) - 1]),
                            ("json_p50_ms", p50), ("json_rps", rate),
                            ("sidecar_cpu_ms", used * 1000 / (streams + requests))):
                        row.setdefault(name, []).append(value)
    return figures, console


def report(figures: dict, console: dict, rounds: int, streams: int, requests: int) -> str:
    medians = {m: {k: statistics.median(v) for k, v in row.items()}
               for m, row in figures.items()}
    closed = medians["closed"]
    lines = [
        "# The console's cost to the request path",
        "",
        f"`bench/console_cost.py --rounds {rounds} --streams {streams} --requests "
        f"{requests}`, {time.strftime('%Y-%m-%d', time.gmtime())}: one `sidecar up` stack "
        "(telemetry on SQLite), the console closed and refreshing alternating round by "
        "round; medians over the rounds. Refreshing: all four pages once a second "
        f"({console['pages']:.0f} pages served in the refreshing rounds, the slowest "
        f"{console['slowest_s'] * 1000:.0f} ms). Sidecar CPU is per request, the "
        "console's work included.",
        "",
        "| console | TTFE p50 ms | TTFE p95 ms | JSON p50 ms (c8) | JSON req/s | "
        "sidecar CPU ms/req |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode in MODES:
        m = medians[mode]
        lines.append(f"| {mode} | {m['ttfe_p50_ms']:.2f} | {m['ttfe_p95_ms']:.2f} | "
                     f"{m['json_p50_ms']:.2f} | {m['json_rps']:.0f} | "
                     f"{m['sidecar_cpu_ms']:.3f} |")
    on = medians["refreshing"]
    lines += ["", "Refreshing against closed: TTFE p50 "
              f"{on['ttfe_p50_ms'] / closed['ttfe_p50_ms']:.2f}×, p95 "
              f"{on['ttfe_p95_ms'] / closed['ttfe_p95_ms']:.2f}×, JSON req/s "
              f"{on['json_rps'] / closed['json_rps']:.2f}×, sidecar CPU per request "
              f"{on['sidecar_cpu_ms'] / closed['sidecar_cpu_ms']:.2f}×."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    figures, console = run(args.rounds, args.streams, args.requests)
    publish(report(figures, console, args.rounds, args.streams, args.requests), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
