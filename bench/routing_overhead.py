"""Benchmark: what the sidecar adds to a request, measured two ways.

1. In-process CPU cost of the sidecar's per-request work (ext_proc adapter + gateway +
   routing, real upb messages, no network) for 1 KB, 16 KB and 1 MB request bodies.
2. End-to-end latency at concurrency 1 on loopback, for a 1 KB chat body, for a 1 MB body
   (long prompt + base64 image) and to the first event of a streamed chat: a demo provider
   called directly, through Envoy alone (a static route), and through Envoy + sidecar
   (`sidecar up --config`), taking turns in batches. The difference between the last two
   is what routing costs a caller.

Usage:  .venv/bin/python bench/routing_overhead.py [--requests 1000] [--rounds 10]
        [--streams 200] [--output FILE]
Prints a Markdown table; with --output also writes it (bench/results/ is the usual place).
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_processes import wait_http
from in_process import chat_wire, one_request
from mode_runner import publish
from stream_probe import probe_streams

from sidecar.config import load_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import FakeProvider
from sidecar.extproc.processor import ExternalProcessor
from sidecar.gateway import Gateway, Runtime
from sidecar.operations.process import keep_large_buffers_in_heap

TOKEN = "bench-token"
STREAMS = "streamed chat, time to the first event"
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


def config_text(provider_url: str) -> str:
    return f"""
providers:
  bench: {{base_url: "{provider_url}", credential: {{env: BENCH_KEY}}}}
callers: [{{name: bench, token_sha256: {DIGEST}}}]
models:
  bench-group:
    strategy: dynamic_score
    targets:
      - {{provider: bench, model_ref: m-a, weight: 3, tags: [vision]}}
      - {{provider: bench, model_ref: m-b, weight: 1, tags: [vision]}}
"""


def chat_body(size: int) -> bytes:
    filler = "x" * max(0, size - 120)
    return json.dumps({"model": "bench-group",
                       "messages": [{"role": "user", "content": filler}]}).encode()


# --- 1. in-process -----------------------------------------------------------------------

def in_process_cost(body: bytes, rounds: int) -> float:
    """Microseconds of sidecar CPU per request (both ext_proc messages), with the allocator
    set up as `sidecar serve` sets it."""
    keep_large_buffers_in_heap()
    config = load_config_text(config_text("http://127.0.0.1:9/v1"))
    processor = ExternalProcessor(Gateway(Runtime(config, {"BENCH_KEY": "k"})))
    wire = chat_wire(body, TOKEN)

    def one() -> None:
        one_request(processor, wire)

    for _ in range(min(rounds, 200)):
        one()
    started = time.process_time()
    for _ in range(rounds):
        one()
    return (time.process_time() - started) / rounds * 1e6


# --- 2. end to end -----------------------------------------------------------------------

async def timed_requests(port: int, path: str, body: bytes, count: int,
                         token: str = TOKEN) -> list[float]:
    """Sequential POSTs on one keep-alive connection; returns latencies in ms."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {token}\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        writer.write(head + body)
        await writer.drain()
        status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        latencies.append((time.perf_counter() - started) * 1000)
        assert b" 200 " in status, status
    writer.close()
    return latencies


def envoy_only_config(listen: int, admin: int, provider_port: int) -> str:
    return json.dumps({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"address": {"socket_address": {"address": "127.0.0.1",
                                                          "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                 "http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "direct",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"},
                                        "route": {"cluster": "provider"}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http."
                                     "router.v3.Router"}}]}}]}]}],
            "clusters": [{"name": "provider", "type": "STATIC", "connect_timeout": "1s",
                "load_assignment": {"cluster_name": "provider", "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {
                        "address": "127.0.0.1", "port_value": provider_port}}}}]}]}}]}})


def summarize(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def end_to_end(bodies: dict[str, tuple[bytes, int]], rounds: int, streams: int
               ) -> dict[str, dict[str, tuple[float, float]]]:
    """p50/p99 per body label (body, request count) for the three paths. All three run at
    once and take turns in `rounds` batches, so drift (other load, CPU clock) hits every
    path alike instead of whichever ran last."""
    path = "/bench/v1/chat/completions"
    with ProviderThread([FakeProvider("bench", api_key="k")]) as providers, \
            tempfile.TemporaryDirectory() as workdir:
        envoy_file = Path(workdir) / "envoy.json"
        listen, admin = free_port(), free_port()
        envoy_file.write_text(envoy_only_config(listen, admin, providers.server.port))
        config = Path(workdir) / "config.yaml"
        config.write_text(config_text(providers.base_url("bench")))
        envoy = start_envoy(envoy_file, "error")
        try:
            wait_http(listen)
            with UpProcess(["--config", str(config)], env={"BENCH_KEY": "k"}).running() as up:
                paths = {  # name: (port, request path, token, body rewritten for the provider)
                    "provider direct": (providers.server.port, path, "k", True),
                    "Envoy direct": (listen, path, "k", True),
                    "Envoy + sidecar (dynamic_score)": (up.listen_port, "/v1/chat/completions",
                                                        TOKEN, False),
                }
                results = {label: _alternate(paths, body, count, rounds)
                           for label, (body, count) in bodies.items()}
                results[STREAMS] = _alternate_streams(paths, streams, rounds)
                return results
        finally:
            envoy.terminate()
            envoy.wait(10)


PathSpec = tuple[int, str, str, bool]  # port, request path, token, body rewritten for the provider
Measure = Callable[[PathSpec, int], list[float]]  # (path, how many) → latencies in ms


def _take_turns(paths: dict[str, PathSpec], measure: Measure, count: int,
                rounds: int) -> dict[str, tuple[float, float]]:
    """`count` measurements per path, the paths taking turns in `rounds` batches."""
    latencies: dict[str, list[float]] = {name: [] for name in paths}
    batch = max(1, count // rounds)
    for _ in range(rounds):
        for name, path in paths.items():
            latencies[name] += measure(path, batch)
    return {name: summarize(values) for name, values in latencies.items()}


def _alternate(paths: dict[str, PathSpec], body: bytes, count: int,
               rounds: int) -> dict[str, tuple[float, float]]:
    rewritten = body.replace(b'"bench-group"', b'"m-a"')  # what the provider gets routed

    def requests(path: PathSpec, how_many: int) -> list[float]:
        port, request_path, token, direct = path
        sent = rewritten if direct else body
        return asyncio.run(timed_requests(port, request_path, sent, how_many, token))

    for path in paths.values():  # warm every path
        requests(path, 5)
    return _take_turns(paths, requests, count, rounds)


def _alternate_streams(paths: dict[str, PathSpec], count: int,
                       rounds: int) -> dict[str, tuple[float, float]]:
    """Time to the first SSE event of a streamed chat (a new connection each), in turns."""
    def streams(path: PathSpec, how_many: int) -> list[float]:
        port, request_path, token, direct = path
        model = "m-a" if direct else "bench-group"
        return list(probe_streams(port, request_path, model, token, how_many).ttfbs_ms)

    return _take_turns(paths, streams, count, rounds)


def image_body(size: int) -> bytes:
    """A long prompt and a base64 image in one user message, `size` bytes in all."""
    prompt = ("Describe what changed between these two screenshots. " * 160)[:8192]
    image = base64.b64encode(os.urandom(max(0, size - len(prompt) - 300) * 3 // 4)).decode()
    return json.dumps({"model": "bench-group", "messages": [{"role": "user", "content": [
        {"type": "text", "text": prompt},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]}]}
    ).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10,
                        help="batches per path, taken in turns")
    parser.add_argument("--streams", type=int, default=200,
                        help="streamed requests per path (time to first event)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    lines = ["## Sidecar CPU per routed request (in-process, upb messages)", "",
             "| body | µs per request |", "| --- | --- |"]
    for label, size, rounds in [("1 KB", 1024, 3000), ("16 KB", 16384, 1000),
                                ("1 MB", 1024 * 1024, 100)]:
        lines.append(f"| {label} | {in_process_cost(chat_body(size), rounds):.0f} |")
    big = max(20, args.requests // 3)
    bodies = {"1 KB chat": (chat_body(1024), args.requests),
              "1 MB prompt + base64 image": (image_body(1024 * 1024), big)}
    for label, paths in end_to_end(bodies, args.rounds, args.streams).items():
        count = bodies[label][1] if label in bodies else args.streams
        lines += ["", f"## Latency at concurrency 1, {label}, {count} requests per path "
                  f"in {args.rounds} alternating batches", "",
                  "| path | p50 ms | p99 ms |", "| --- | --- | --- |"]
        lines += [f"| {name} | {p50:.2f} | {p99:.2f} |" for name, (p50, p99) in paths.items()]
        base, routed = paths["Envoy direct"], paths["Envoy + sidecar (dynamic_score)"]
        lines += ["", f"Added by the sidecar over Envoy direct: p50 "
                  f"{routed[0] - base[0]:+.2f} ms, p99 {routed[1] - base[1]:+.2f} ms."]
    publish("\n".join(lines) + "\n", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
