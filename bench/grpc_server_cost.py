"""What the escape hatch costs: the sidecar's gRPC port served by its own server
(`--grpc-server own`, the default) against grpcio (`--grpc-server grpcio`), side by side.

Rows, alternating round by round so the shared machine's drift hits both alike: Envoy 1.40
+ `sidecar serve` routing the SPEC's `adaptive-agent` group (`dynamic_score`) to a fast
fake provider (bench_processes.fast_provider), one sidecar process, channel token on.
Per row: requests/s and the sidecar's and Envoy's CPU per routed request at concurrency 32
(wrk, 1 KB chat bodies, a new conversation per request), p50/p99 at concurrency 1 with 1 KB
and with 1 MB bodies, the sidecar's peak RSS. Medians over the rounds; the ratios come from
the same run.

Usage:  .venv/bin/python bench/grpc_server_cost.py [--rounds 3] [--seconds 5] [--output F]
Loopback only; every process it starts it also stops. Needs Debian's `wrk`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from bench_processes import TOKEN, Processes, fast_provider, sidecar_config, wait_http
from mode_runner import publish
from wrk_load import run_wrk

from sidecar.config import load_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import free_port
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import render_envoy_yaml
from sidecar.grpcwire.auth import ensure_channel_token

SERVERS = ("own", "grpcio")
CHAT = "/v1/chat/completions"
GROUP = "adaptive-agent"


def stack(workdir: Path, server: str, fast_port: int) -> tuple[Processes, int]:
    """Envoy + one `sidecar serve --grpc-server <server>`; returns them and Envoy's port."""
    config = workdir / "sidecar.yaml"
    fast = f"http://127.0.0.1:{fast_port}/v1"
    config.write_text(sidecar_config("dynamic_score", fast_port, fast, TOKEN))
    token_file = workdir / "grpc-token"
    token = ensure_channel_token(token_file)
    listen, grpc_port, admin_http = free_port(), free_port(), free_port()
    running = Processes()
    running.add("sidecar", subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config),
         "--listen", f"127.0.0.1:{grpc_port}", "--admin-http", f"127.0.0.1:{admin_http}",
         "--grpc-token-file", str(token_file), "--grpc-server", server,
         "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_http(admin_http, "/healthz")
    document = yaml.safe_load(render_envoy_yaml(
        load_config_text(config.read_text()),
        EnvoyAddresses(listen=f"127.0.0.1:{listen}", admin=f"127.0.0.1:{free_port()}",
                       ext_proc=f"127.0.0.1:{grpc_port}"), token))
    envoy_file = workdir / f"envoy-{server}.yaml"
    envoy_file.write_text(yaml.safe_dump(document))
    running.named = {"envoy": start_envoy(envoy_file, "error"), **running.named}
    wait_http(listen)
    return running, listen


def measure(workdir: Path, server: str, fast_port: int, seconds: float) -> dict[str, float]:
    processes, port = stack(workdir, server, fast_port)
    try:
        run_wrk(port, CHAT, GROUP, TOKEN, 32, 2)  # warm-up (observations, connections)
        before = processes.cpu_seconds()
        load = run_wrk(port, CHAT, GROUP, TOKEN, 32, seconds)
        after = processes.cpu_seconds()
        c1 = run_wrk(port, CHAT, GROUP, TOKEN, 1, seconds)
        large = run_wrk(port, CHAT, GROUP, TOKEN, 1, seconds, body_bytes=1024 * 1024)
        failed = [r.failure_detail for r in (load, c1, large) if r.bad_responses]
        if failed:
            raise RuntimeError(f"{server}: failed requests ({'; '.join(failed)})")
        return {
            "rps": load.requests_per_s,
            "sidecar_us": (after["sidecar"] - before["sidecar"]) / load.requests * 1e6,
            "envoy_us": (after["envoy"] - before["envoy"]) / load.requests * 1e6,
            "p50_c1": c1.p50_ms, "p99_c1": c1.p99_ms,
            "p50_1mb": large.p50_ms, "p99_1mb": large.p99_ms,
            "rss_mb": processes.peak_rss_mb("sidecar"),
        }
    finally:
        processes.stop()


def report(runs: dict[str, list[dict[str, float]]], rounds: int, seconds: float) -> str:
    medians = {server: {key: statistics.median(r[key] for r in results)
                        for key in results[0]} for server, results in runs.items()}
    lines = [f"## gRPC server: own vs grpcio ({rounds} alternating rounds, {seconds:g} s per "
             "phase; medians)", "",
             "| `--grpc-server` | req/s c32 | sidecar CPU µs / req | Envoy CPU µs / req "
             "| p50 / p99 ms c1 (1 KB) | p50 / p99 ms c1 (1 MB) | sidecar peak RSS MB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for server, m in medians.items():
        lines.append(f"| {server} | {m['rps']:,.0f} | {m['sidecar_us']:.0f} | "
                     f"{m['envoy_us']:.0f} | {m['p50_c1']:.2f} / {m['p99_c1']:.2f} | "
                     f"{m['p50_1mb']:.2f} / {m['p99_1mb']:.2f} | {m['rss_mb']:.0f} |")
    own, grpcio = medians["own"], medians["grpcio"]
    lines += ["", f"grpcio against own, same run: sidecar CPU per request "
                  f"×{grpcio['sidecar_us'] / own['sidecar_us']:.2f}, req/s "
                  f"×{grpcio['rps'] / own['rps']:.2f}, c1 p50 "
                  f"{grpcio['p50_c1'] - own['p50_c1']:+.2f} ms (1 KB), "
                  f"{grpcio['p50_1mb'] - own['p50_1mb']:+.2f} ms (1 MB).", "",
              "Per round (req/s, sidecar µs / req):", ""]
    for server, results in runs.items():
        figures = ", ".join(f"{r['rps']:,.0f} / {r['sidecar_us']:.0f}" for r in results)
        lines.append(f"- {server}: {figures}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {server: [] for server in SERVERS}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        try:
            for round_index in range(args.rounds):
                order = SERVERS if round_index % 2 == 0 else SERVERS[::-1]
                for server in order:
                    runs[server].append(measure(workdir, server, fast_port, args.seconds))
        finally:
            provider.stop()
    publish(report(runs, args.rounds, args.seconds), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
