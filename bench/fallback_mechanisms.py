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

from functools import partial
from pathlib import Path

from mode_runner import HTTP_OPTIONS, comparison_main, grpc_cluster, latencies, run_mode

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
            options = cluster["typed_extension_protocol_options"][HTTP_OPTIONS]
            options["http_filters"] = [
                {"name": "envoy.filters.http.ext_proc", "typed_config": processor},
                {"name": "envoy.filters.http.upstream_codec", "typed_config": codec}]
    document["static_resources"]["clusters"].append(grpc_cluster("retarget", port))


def one_run(mode: str, count: int, provider_url: str, workdir: Path) -> dict[str, float]:
    extend = (None if mode == "router_only" else
              partial(add_upstream_processor, with_body=mode == "upstream_with_body"))
    return run_mode(mode, provider_url, workdir, count, latencies, extend=extend,
                    helper_source=UPSTREAM_PROCESSOR, helper_cluster="retarget")


def main() -> int:
    return comparison_main("Per-attempt upstream ext_proc",
                           ("router_only", "upstream_headers_only", "upstream_with_body"),
                           one_run, default_requests=400, workload="1 KB requests")


if __name__ == "__main__":
    raise SystemExit(main())
