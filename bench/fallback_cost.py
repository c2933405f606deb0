"""Benchmark: what the built pre-commit fallback costs a request that does not need it.

Every mode runs the real sidecar and Envoy with observations on (1 KB non-streaming
requests to one healthy target). `full` is the bootstrap exactly as rendered; each other
mode removes one fallback piece from it, so the difference to `full` is that piece's cost:

  full                 as rendered
  no_attempt_filters   without the target clusters' upstream filters (retarget hook behind
                       its first-attempt matcher, header stripping, upstream codec)
  no_custom_response   without the filter that rewrites a final provider error
  no_attempt_log       without the router's per-attempt access log
  no_retry_policy      without the route's retry policy (no fallback at all)

Usage:  .venv/bin/python bench/fallback_cost.py [--requests 1000] [--rounds 3] [--output F]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mode_runner import HTTP_OPTIONS, comparison_main, connection_manager, latencies, run_mode


def _route(document: dict) -> dict:
    return connection_manager(document)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]


def without_attempt_filters(document: dict, _port: int) -> None:
    for cluster in document["static_resources"]["clusters"]:
        if cluster["name"].startswith("target__"):
            cluster["typed_extension_protocol_options"][HTTP_OPTIONS].pop("http_filters")


def without_custom_response(document: dict, _port: int) -> None:
    manager = connection_manager(document)
    manager["http_filters"] = [f for f in manager["http_filters"]
                               if f["name"] != "envoy.filters.http.custom_response"]


def without_attempt_log(document: dict, _port: int) -> None:
    router = connection_manager(document)["http_filters"][-1]["typed_config"]
    router.pop("upstream_log")


def without_retry_policy(document: dict, _port: int) -> None:
    _route(document).pop("retry_policy")


EXTEND: dict[str, Callable[[dict, int], None] | None] = {
    "full": None,
    "no_attempt_filters": without_attempt_filters,
    "no_custom_response": without_custom_response,
    "no_attempt_log": without_attempt_log,
    "no_retry_policy": without_retry_policy,
}


def one_run(mode: str, count: int, provider_url: str, workdir: Path) -> dict[str, float]:
    # settle: the access-log batches of the last requests are counted in the sidecar's CPU
    return run_mode(mode, provider_url, workdir, count, latencies, observations=True,
                    extend=EXTEND[mode], settle_s=0.5)


def main() -> int:
    return comparison_main("Fallback pieces on the happy path", tuple(EXTEND), one_run,
                           default_requests=1000, workload="1 KB requests")


if __name__ == "__main__":
    raise SystemExit(main())
