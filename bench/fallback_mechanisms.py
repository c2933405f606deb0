"""Benchmark for the pre-commit fallback design (issue #6): what a per-attempt upstream
ext_proc filter would cost on every request, before any of it is built.

Modes (same sidecar, same Envoy, same demo provider, 1 KB non-streaming requests):
  router_only            today: the router-level ext_proc rewrites model, path and key
  upstream_headers_only  plus an upstream ext_proc on the target cluster that sees only the
                         attempt's headers (the cheapest per-attempt hook)
  upstream_with_body     plus an upstream ext_proc that also buffers the attempt's body and
                         rewrites its `model` (what per-attempt retargeting needs)

The upstream processor is a minimal Python gRPC server in its own process. Reports client
p50/p99 latency at concurrency 1 and CPU seconds per 1,000 requests for Envoy and for the
Python processes, as medians of interleaved rounds; the script checks through Envoy's stats
that the upstream processor saw every attempt.

Usage:  .venv/bin/python bench/fallback_mechanisms.py [--requests 400] [--rounds 3] [--output F]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from observation_cost import TOKEN, config_text, cpu_seconds

from sidecar.config import load_config_text
from sidecar.devstack.harness import ProviderThread, free_port
from sidecar.devstack.providers import FakeProvider
from sidecar.devstack.stack import start_envoy
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import render_envoy_yaml

UPSTREAM_PROCESSOR = '''
import asyncio, json, sys, grpc
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as g
class Retarget(g.ExternalProcessorServicer):
    async def Process(self, requests, context):
        async for message in requests:
            if message.HasField("request_headers"):
                yield ext.ProcessingResponse(request_headers=ext.HeadersResponse())
                if message.request_headers.end_of_stream:
                    return
            elif message.HasField("request_body"):
                body = json.loads(message.request_body.body)
                body["model"] = "m-retargeted"
                data = json.dumps(body).encode()
                length = HeaderValueOption(header=HeaderValue(
                    key="content-length", raw_value=str(len(data)).encode()))
                yield ext.ProcessingResponse(request_body=ext.BodyResponse(
                    response=ext.CommonResponse(
                        header_mutation=ext.HeaderMutation(set_headers=[length]),
                        body_mutation=ext.BodyMutation(body=data))))
                return
async def main():
    server = grpc.aio.server()
    g.add_ExternalProcessorServicer_to_server(Retarget(), server)
    server.add_insecure_port(sys.argv[1])
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
'''
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def add_upstream_processor(document: dict, port: int, with_body: bool) -> None:
    """Give every target cluster an upstream ext_proc filter, then the upstream codec."""
    processor = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3."
                 "ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "retarget"}},
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SKIP",
                            "request_body_mode": "BUFFERED" if with_body else "NONE"}}
    codec = {"@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3."
                      "UpstreamCodec"}
    for cluster in document["static_resources"]["clusters"]:
        if cluster["name"].startswith("target__"):
            options = cluster["typed_extension_protocol_options"][_HTTP_OPTIONS]
            options["http_filters"] = [
                {"name": "envoy.filters.http.ext_proc", "typed_config": processor},
                {"name": "envoy.filters.http.upstream_codec", "typed_config": codec}]
    document["static_resources"]["clusters"].append({
        "name": "retarget", "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": {_HTTP_OPTIONS: {
            "@type": "type.googleapis.com/" + _HTTP_OPTIONS,
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "retarget", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                         "port_value": port}}}}]}]}})


async def latencies(port: int, count: int) -> list[float]:
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


def processor_streams(admin_port: int) -> int:
    stats = httpx.get(f"http://127.0.0.1:{admin_port}/stats?filter=cluster.retarget."
                      "upstream_rq_total", timeout=5).text
    return sum(int(line.rsplit(":", 1)[1]) for line in stats.splitlines() if ":" in line)


def run_mode(mode: str, count: int, provider_url: str, workdir: Path) -> dict[str, float]:
    listen, admin, grpc_port, processor_port = (free_port() for _ in range(4))
    config = workdir / f"{mode}.yaml"
    config.write_text(config_text(provider_url, observations=False))
    document = yaml.safe_load(render_envoy_yaml(
        load_config_text(config.read_text()),
        EnvoyAddresses(listen=f"127.0.0.1:{listen}", admin=f"127.0.0.1:{admin}",
                       ext_proc=f"127.0.0.1:{grpc_port}")))
    processes = [subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--listen",
         f"127.0.0.1:{grpc_port}", "--admin-http", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    if mode != "router_only":
        add_upstream_processor(document, processor_port, with_body=mode == "upstream_with_body")
        processes.append(subprocess.Popen([sys.executable, "-c", UPSTREAM_PROCESSOR,
                                           f"127.0.0.1:{processor_port}"]))
    envoy_file = workdir / f"{mode}-envoy.yaml"
    envoy_file.write_text(yaml.safe_dump(document))
    envoy = start_envoy(envoy_file, "error")
    try:
        time.sleep(2.0)
        asyncio.run(latencies(listen, 50))  # warm-up
        python_before = sum(cpu_seconds(p.pid) for p in processes)
        envoy_before = cpu_seconds(envoy.pid)
        measured = sorted(asyncio.run(latencies(listen, count)))
        python_cpu = sum(cpu_seconds(p.pid) for p in processes) - python_before
        envoy_cpu = cpu_seconds(envoy.pid) - envoy_before
        if mode != "router_only" and processor_streams(admin) < count:
            raise RuntimeError("the upstream processor did not see every attempt")
    finally:
        for process in [envoy, *processes]:
            process.terminate()
            process.wait(10)
    return {"p50": statistics.median(measured), "p99": measured[int(len(measured) * .99) - 1],
            "python_cpu_per_1k": python_cpu / count * 1000,
            "envoy_cpu_per_1k": envoy_cpu / count * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    modes = ("router_only", "upstream_headers_only", "upstream_with_body")
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with ProviderThread([FakeProvider("bench")]) as providers, \
            tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.rounds):
            for mode in modes:
                runs[mode].append(run_mode(mode, args.requests, providers.base_url("bench"),
                                           Path(workdir)))
    lines = [f"## Per-attempt upstream ext_proc: {args.rounds} interleaved rounds of "
             f"{args.requests} 1 KB requests, concurrency 1; medians", "",
             "| mode | p50 ms | p99 ms | Python CPU s / 1k req | Envoy CPU s / 1k req |",
             "| --- | --- | --- | --- | --- |"]
    for mode in modes:
        r = {key: statistics.median(run[key] for run in runs[mode]) for key in runs[mode][0]}
        lines.append(f"| {mode} | {r['p50']:.2f} | {r['p99']:.2f} | "
                     f"{r['python_cpu_per_1k']:.2f} | {r['envoy_cpu_per_1k']:.2f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
