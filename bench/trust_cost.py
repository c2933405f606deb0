"""Benchmark: what the trust-boundary pieces of issue 13 cost a request on the happy path.

Every mode runs the real sidecar (with its channel token) and Envoy, observations on, 1 KB
non-streaming requests to one healthy target:

  full                 as rendered (response-header allowlist, hold of bounded replies)
  with_key             plus Envoy's credential injector on the target cluster, as every
                       provider with a key has (a static generic secret stands in for the
                       SDS file)
  no_response_filter   without the Lua filter that keeps only allowlisted response headers
  no_hold_filter       without the per-attempt Lua filter that holds a bounded reply

Usage:  .venv/bin/python bench/trust_cost.py [--requests 1000] [--rounds 3] [--output F]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mode_runner import HTTP_OPTIONS, comparison_main, connection_manager, latencies, run_mode

INJECTOR = {
    "name": "envoy.filters.http.credential_injector",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3."
                 "CredentialInjector",
        "overwrite": True,
        "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic."
                     "v3.Generic",
            "credential": {"name": "bench_key"}, "header": "authorization",
            "header_value_prefix": "Bearer "}}}}


def _target_filters(document: dict) -> list[list[dict]]:
    return [cluster["typed_extension_protocol_options"][HTTP_OPTIONS]["http_filters"]
            for cluster in document["static_resources"]["clusters"]
            if cluster["name"].startswith("target__")]


def with_key(document: dict, _port: int) -> None:
    document["static_resources"]["secrets"] = [
        {"name": "bench_key", "generic_secret": {"secret": {"inline_string": "bench-key"}}}]
    for filters in _target_filters(document):
        filters.insert(len(filters) - 1, INJECTOR)


def without_response_filter(document: dict, _port: int) -> None:
    manager = connection_manager(document)
    manager["http_filters"] = [f for f in manager["http_filters"]
                               if f["name"] != "sidecar.response_headers"]


def without_hold_filter(document: dict, _port: int) -> None:
    for filters in _target_filters(document):
        filters[:] = [f for f in filters if f["name"] != "sidecar.hold_bounded_replies"]


EXTEND: dict[str, Callable[[dict, int], None] | None] = {
    "full": None,
    "with_key": with_key,
    "no_response_filter": without_response_filter,
    "no_hold_filter": without_hold_filter,
}


def one_run(mode: str, count: int, provider_url: str, workdir: Path) -> dict[str, float]:
    return run_mode(mode, provider_url, workdir, count, latencies, observations=True,
                    extend=EXTEND[mode], settle_s=0.5)


def main() -> int:
    return comparison_main("Trust-boundary pieces on the happy path", tuple(EXTEND), one_run,
                           default_requests=1000, workload="1 KB requests")


if __name__ == "__main__":
    raise SystemExit(main())
