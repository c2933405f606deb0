"""Shared machinery of the benchmarks that compare Envoy + sidecar set-ups ("modes").

A mode is the rendered Envoy bootstrap, optionally extended with an extra gRPC helper
process (an observer, a per-attempt processor …). `run_mode` starts `sidecar serve`, the
helper and Envoy on free loopback ports, warms up, measures client latency and the CPU time
of Envoy and of the Python processes, checks that the helper really saw the traffic, and
stops everything it started. `compare` runs the modes in interleaved rounds so drift hits
every mode alike, and `table`/`publish` write the Markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import httpx
import yaml

from sidecar.config import load_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import ProviderThread, free_port
from sidecar.devstack.providers import FakeProvider
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import render_envoy_yaml
from sidecar.grpcwire.auth import ensure_channel_token

TOKEN = "bench-token"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
Load = Callable[[int, int], Awaitable[list[float]]]   # (listen port, count) → latencies ms
Extend = Callable[[dict, int], None]                  # (Envoy document, helper port)
Medians = dict[str, dict[str, float]]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def config_text(provider_url: str, observations: bool, group: str = "") -> str:
    """One caller, one group `g` with one target on the demo provider `bench`; `group`:
    more keys of the group, as YAML flow-mapping entries (`fallback: {...}`)."""
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    extra = f", {group}" if group else ""
    return (f"providers: {{bench: {{base_url: '{provider_url}'}}}}\n"
            f"callers: [{{name: bench, token_sha256: {digest}}}]\n"
            f"observations: {{enabled: {str(observations).lower()}}}\n"
            f"models: {{g: {{targets: [{{provider: bench, model_ref: m}}]{extra}}}}}\n")


def connection_manager(document: dict) -> dict:
    """The HTTP connection manager of a rendered bootstrap (as data)."""
    return document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]


def grpc_cluster(name: str, port: int) -> dict:
    """A static HTTP/2 cluster for a helper gRPC server on loopback."""
    return {
        "name": name, "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": {HTTP_OPTIONS: {
            "@type": "type.googleapis.com/" + HTTP_OPTIONS,
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                         "port_value": port}}}}]}]},
    }


def cluster_streams(admin_port: int, cluster: str) -> int:
    """Requests (gRPC streams) Envoy sent to `cluster`: proves a helper really ran."""
    stats = httpx.get(f"http://127.0.0.1:{admin_port}/stats?filter=cluster.{cluster}."
                      "upstream_rq_total", timeout=5).text
    return sum(int(line.rsplit(":", 1)[1]) for line in stats.splitlines() if ":" in line)


async def latencies(port: int, count: int) -> list[float]:
    """`count` 1 KB chat requests one after another; client latency of each in ms."""
    body = {"model": "g", "messages": [{"role": "user", "content": "x" * 900}]}
    results = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10,
                                 headers={"authorization": f"Bearer {TOKEN}"}) as client:
        for _ in range(count):
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            results.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.text
    return results


def wait_ready(listen: int, timeout_s: float = 60.0) -> None:
    """Until the client listener's `/ready` answers 200 (Envoy up, the sidecar past Envoy's
    health check): a fixed pause was too short on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{listen}/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"127.0.0.1:{listen}/ready did not answer 200 within {timeout_s:.0f} s")


def run_mode(name: str, provider_url: str, workdir: Path, count: int, load: Load, *,
             observations: bool = False, extend: Extend | None = None,
             helper_source: str | None = None, helper_cluster: str | None = None,
             settle_s: float = 0.0, group: str = "") -> dict[str, float]:
    listen, admin, grpc_port, helper_port = (free_port() for _ in range(4))
    config = workdir / f"{name}.yaml"
    config.write_text(config_text(provider_url, observations, group))
    token_file = workdir / f"{name}.grpc-token"
    document = yaml.safe_load(render_envoy_yaml(
        load_config_text(config.read_text()),
        EnvoyAddresses(listen=f"127.0.0.1:{listen}", admin=f"127.0.0.1:{admin}",
                       ext_proc=f"127.0.0.1:{grpc_port}"),
        ensure_channel_token(token_file)))
    processes = [subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--listen",
         f"127.0.0.1:{grpc_port}", "--admin-http", f"127.0.0.1:{free_port()}",
         "--grpc-token-file", str(token_file), "--drain-seconds", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    if extend is not None:
        extend(document, helper_port)
    if helper_source is not None:
        processes.append(subprocess.Popen([sys.executable, "-c", helper_source,
                                           f"127.0.0.1:{helper_port}"]))
    envoy_file = workdir / f"{name}-envoy.yaml"
    envoy_file.write_text(yaml.safe_dump(document))
    envoy = start_envoy(envoy_file, "error")
    try:
        wait_ready(listen)
        asyncio.run(load(listen, 50))  # warm-up
        python_before = sum(cpu_seconds(p.pid) for p in processes)
        envoy_before = cpu_seconds(envoy.pid)
        latencies = sorted(asyncio.run(load(listen, count)))
        time.sleep(settle_s)
        python_cpu = sum(cpu_seconds(p.pid) for p in processes) - python_before
        envoy_cpu = cpu_seconds(envoy.pid) - envoy_before
        if helper_cluster is not None:
            seen = cluster_streams(admin, helper_cluster)
            if seen < count:
                raise RuntimeError(f"{name}: the helper saw {seen} of {count} requests")
    finally:
        for process in [envoy, *processes]:
            process.terminate()
            process.wait(10)
    return {"p50": statistics.median(latencies),
            "p99": latencies[int(len(latencies) * .99) - 1],
            "python_cpu_per_1k": python_cpu / count * 1000,
            "envoy_cpu_per_1k": envoy_cpu / count * 1000}


def compare(modes: Sequence[str], rounds: int,
            run: Callable[[str], dict[str, float]]) -> Medians:
    """Interleaved rounds (every mode once per round), then the median of each figure."""
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode in modes:
            runs[mode].append(run(mode))
    return {mode: {key: statistics.median(r[key] for r in results) for key in results[0]}
            for mode, results in runs.items()}


def table(title: str, medians: Medians, notes: Sequence[str] = ()) -> str:
    lines = [f"## {title}", "",
             "| mode | p50 ms | p99 ms | Python CPU s / 1k req | Envoy CPU s / 1k req |",
             "| --- | --- | --- | --- | --- |"]
    for mode, r in medians.items():
        lines.append(f"| {mode} | {r['p50']:.2f} | {r['p99']:.2f} | "
                     f"{r['python_cpu_per_1k']:.2f} | {r['envoy_cpu_per_1k']:.2f} |")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


OneRun = Callable[[str, int, str, Path], dict[str, float]]  # (mode, count, provider, dir)


def comparison_main(description: str, modes: Sequence[str], one_run: OneRun,
                    default_requests: int, workload: str, notes: Sequence[str] = ()) -> int:
    """Command line shared by the comparison benchmarks: --requests, --rounds, --output."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--requests", type=int, default=default_requests, help="per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with ProviderThread([FakeProvider("bench")]) as providers, \
            tempfile.TemporaryDirectory() as workdir:
        medians = compare(modes, args.rounds, lambda mode: one_run(
            mode, args.requests, providers.base_url("bench"), Path(workdir)))
    title = (f"{description}: {args.rounds} interleaved rounds of {args.requests} {workload}, "
             "concurrency 1; medians")
    publish(table(title, medians, notes), args.output)
    return 0


def publish(report: str, output: Path | None) -> None:
    print(report)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(report)
