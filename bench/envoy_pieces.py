"""Benchmark: where a routed request's CPU goes, piece by piece (issue #32).

Rows, alternating round by round as side_by_side.py runs them (wrk at concurrency 32 and
1 with 1 KB chat bodies, a distinct conversation each, and streams to the demo provider):

  Envoy alone       a plain proxy to the same fast provider (the physical limit)
  full              Envoy + sidecar as rendered for the SPEC's dynamic_score group, with
                    provider keys (so the credential injector is in), telemetry off
  − <piece>         the same bootstrap with one piece taken out, so the difference to
                    `full` is what that piece costs; what each buys is in the table

Pieces: the router-level ext_proc exchange (with it the routing: the route then names the
first target's cluster), the access-log service, the router's per-attempt log,
`json_to_metadata`, `sse_to_metadata`, `header_to_metadata`, the bounded-reply hold, the
undeclared-length gate, the retry-retarget upstream ext_proc, the upstream header
mutation, the credential injector, `custom_response` with the local-reply mapping, the
response-header allowlist, the unasked-usage filter, the health-check filter and the
`priority_group` specifier. A piece taken out changes what the stack does (no
observations, no fallback, ...): these rows measure cost, not a configuration to run.

Usage:  .venv/bin/python bench/envoy_pieces.py [--rounds 3] [--seconds 5] [--pieces a,b]
            [--output bench/results/envoy_pieces.md]
Loopback only; every process it starts it also stops. wrk from Debian's package.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path

from bench_processes import TOKEN, sidecar_config, sidecar_stack, start_envoy_direct
from mode_runner import HTTP_OPTIONS, connection_manager, publish
from side_by_side import CHAT_PATH, Row, Started, alternate

from sidecar.devstack.harness import ProviderThread

KEY_ENV = "BENCH_PROVIDER_KEY"
Edit = Callable[[dict], None]


def _filters(document: dict) -> list[dict]:
    return connection_manager(document)["http_filters"]


def _drop_filter(*names: str) -> Edit:
    def edit(document: dict) -> None:
        manager = connection_manager(document)
        manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] not in names]
    return edit


def _drop_upstream_filter(name: str) -> Edit:
    def edit(document: dict) -> None:
        for cluster in document["static_resources"]["clusters"]:
            options = cluster.get("typed_extension_protocol_options", {}).get(HTTP_OPTIONS)
            if options and "http_filters" in options:
                options["http_filters"] = [f for f in options["http_filters"]
                                           if f["name"] != name]
    return edit


def _route(document: dict) -> dict:
    return connection_manager(document)["route_config"]["virtual_hosts"][0]["routes"][-1][
        "route"]


def _first_target(document: dict) -> str:
    return next(c["name"] for c in document["static_resources"]["clusters"]
                if c["name"].startswith("target__adaptive-agent__0"))


def _static_route(document: dict) -> None:
    """The route names the first target's cluster instead of the per-request order."""
    route = _route(document)
    route.pop("inline_cluster_specifier_plugin", None)
    route["cluster"] = _first_target(document)


def without_ext_proc(document: dict) -> None:
    """No router-level exchange: JSON requests go to the first target, streams (`/drip/…`,
    as for Envoy alone) to the stream group's first target."""
    _drop_filter("envoy.filters.http.ext_proc")(document)
    _static_route(document)
    _stream_route(document)


def _stream_route(document: dict) -> None:
    stream_cluster = next(c["name"] for c in document["static_resources"]["clusters"]
                          if c["name"].startswith("target__stream-group__0"))
    routes = connection_manager(document)["route_config"]["virtual_hosts"][0]["routes"]
    routes.insert(len(routes) - 1, {"match": {"prefix": "/drip/"},
                                    "route": {"cluster": stream_cluster, "timeout": "60s"}})


def without_access_log(document: dict) -> None:
    connection_manager(document).pop("access_log", None)


def without_upstream_log(document: dict) -> None:
    _filters(document)[-1]["typed_config"].pop("upstream_log", None)


def without_local_replies(document: dict) -> None:
    _drop_filter("envoy.filters.http.custom_response")(document)
    connection_manager(document).pop("local_reply_config", None)


def without_priority_group(document: dict) -> None:
    """The sidecar still decides, but the route ignores its order: every request goes to
    the first target."""
    _static_route(document)


PIECES: dict[str, tuple[Edit, str]] = {
    "ext_proc": (without_ext_proc, "the routing decision, caller auth, quotas, cache, "
                 "bridges: everything the sidecar decides"),
    "access_log": (without_access_log, "observations (live scores, thresholds), quotas' "
                   "token and spend counts, telemetry rows"),
    "upstream_log": (without_upstream_log, "per-attempt records: failed attempts in "
                     "reliability scores and fallback rows"),
    "json_usage": (_drop_filter("sidecar.json_usage"), "usage of unary JSON replies "
                   "(tokens, cost, throughput)"),
    "sse_to_metadata": (_drop_filter("envoy.filters.http.sse_to_metadata"), "usage of "
                        "streamed replies"),
    "header_to_metadata": (_drop_filter("sidecar.kept_response_headers"),
                           "providers' retry-after and reset headers"),
    "hold_bounded_replies": (_drop_upstream_filter("sidecar.hold_bounded_replies"),
                             "fallback for replies that break before their end"),
    "gate_undeclared_length": (_drop_upstream_filter("sidecar.gate_undeclared_length"),
                               "usage and fallback for chunked JSON replies"),
    "retarget_retry": (_drop_upstream_filter("sidecar.retarget_retry"), "fallback to "
                       "another target (body and path rewritten per attempt)"),
    "header_mutation": (_drop_upstream_filter("envoy.filters.http.header_mutation"),
                        "per-target headers stripped and set on every attempt"),
    "credential_injector": (_drop_upstream_filter("envoy.filters.http.credential_injector"),
                            "provider keys added by Envoy (never by the sidecar)"),
    "local_replies": (without_local_replies, "errors in the caller's dialect (a final "
                      "provider error, Envoy's own replies)"),
    "response_headers": (_drop_filter("sidecar.response_headers"), "the response-header "
                         "allowlist (no provider header reaches the caller unvetted)"),
    "strip_unasked_usage": (_drop_filter("sidecar.strip_unasked_usage"), "a Chat stream's "
                            "usage asked for on the caller's behalf, taken back out"),
    "health_check": (_drop_filter("envoy.filters.http.health_check"), "GET /ready for "
                     "balancers (drains no client sees)"),
    "priority_group": (without_priority_group, "the per-request attempt order (fallback "
                       "across targets)"),
}


# How a row's stream probe reaches a stream: through the route as usual, by path (no
# sidecar to route it), or not at all (the route without its per-request order names one
# JSON target; the probe then goes to the demo provider directly and the row shows no TTFB).
STREAMS = {"ext_proc": "by_path", "priority_group": "none"}


def config_with_keys(fast_port: int, drip_url: str, token: str,
                     strategy: str = "dynamic_score") -> str:
    """The SPEC's group under `strategy`, each provider with a key in the environment (so
    Envoy injects it), as a real deployment has them."""
    text = sidecar_config(strategy, fast_port, drip_url, token)
    return text.replace("credential: null", f"credential: {{env: {KEY_ENV}}}")


def rows(fast_port: int, drip: ProviderThread, pieces: list[str]) -> list[Row]:
    drip_url = drip.base_url("drip")
    drip_path = "/drip" + CHAT_PATH

    def envoy(workdir: Path) -> Started:
        processes, port = start_envoy_direct(workdir, fast_port, drip.server.port)
        return Started(processes, port, "m", port, drip_path, "drip-model")

    def sidecar(edit: Edit | None, streams: str = "routed") -> Callable[[Path], Started]:
        def start(workdir: Path) -> Started:
            processes, port = sidecar_stack(
                workdir, "dynamic_score", fast_port, drip_url, "",
                config_text=config_with_keys(fast_port, drip_url, TOKEN), edit=edit)
            if streams == "by_path":  # no sidecar: streams by path, as for Envoy alone
                return Started(processes, port, "adaptive-agent", port, drip_path,
                               "drip-model")
            if streams == "none":  # the route cannot reach the stream group: not measured
                return Started(processes, port, "adaptive-agent", drip.server.port,
                               drip_path, "drip-model")
            return Started(processes, port, "adaptive-agent", port, CHAT_PATH,
                           "stream-group")
        return start

    table = [Row("Envoy alone", envoy), Row("full", sidecar(None))]
    table += [Row(f"− {name}", sidecar(PIECES[name][0], STREAMS.get(name, "routed")))
              for name in pieces]
    return table


def report(table: list[Row], rounds: int, seconds: float,
           failures: dict[str, str] | None = None) -> str:
    medians = {row.name: {key: statistics.median(r[key] for r in row.results)
                          for key in row.results[0]} for row in table}
    full = medians["full"]

    def us(m: dict[str, float], name: str) -> float:
        return m.get(f"cpu_{name}", 0.0) * 1000  # CPU s per 1k requests → µs per request

    envoy_alone = us(medians["Envoy alone"], "envoy")

    lines = [f"## Where the CPU goes: {rounds} alternating rounds, {seconds:g} s per load "
             "phase; medians", "",
             "| row | req/s c32 | Envoy µs/req | sidecar µs/req | total × Envoy alone | "
             "Δ Envoy µs vs full | Δ sidecar µs vs full | p50 / p99 ms c1 | stream TTFB p50 ms "
             "| what the piece buys |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- "
             "| ---: | --- |"]
    for name, m in medians.items():
        total = us(m, "envoy") + us(m, "sidecar")
        piece = name[2:] if name.startswith("− ") else None
        delta_envoy = us(full, "envoy") - us(m, "envoy")
        delta_sidecar = us(full, "sidecar") - us(m, "sidecar")
        lines.append(
            f"| {name} | {m['rps_c32']:,.0f} | {us(m, 'envoy'):.0f} | {us(m, 'sidecar'):.0f} | "
            f"{total / envoy_alone:.2f} | "
            f"{'—' if piece is None else f'{delta_envoy:+.0f}'} | "
            f"{'—' if piece is None else f'{delta_sidecar:+.0f}'} | "
            f"{m['p50_c1']:.2f} / {m['p99_c1']:.2f} | "
            f"{'—' if STREAMS.get(piece or '') == 'none' else format(m['ttfb_p50'], '.2f')} | "
            f"{PIECES[piece][1] if piece else ''} |")
    lines += ["", f"Envoy alone: {envoy_alone:.0f} µs of Envoy CPU per request. "
              "Δ columns: what taking the piece out saves, against `full` (positive: the "
              "piece costs that much). CPU is per request at concurrency 32; the provider is "
              "an Envoy answering a fixed completion (not counted)."]
    for name, reason in sorted((failures or {}).items()):
        lines.append(f"- {name}: failed in at least one round ({reason}); without the piece "
                     "the stack does not serve that request kind")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--pieces", default=",".join(PIECES))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    pieces = [p for p in args.pieces.split(",") if p]
    unknown = [p for p in pieces if p not in PIECES]
    if unknown:
        parser.error(f"unknown pieces: {', '.join(unknown)} (known: {', '.join(PIECES)})")
    os.environ.setdefault(KEY_ENV, "bench-provider-key")  # Envoy reads it (SDS)
    failures: dict[str, str] = {}

    def failed(row: Row, exc: Exception) -> None:
        failures[row.name] = f"{type(exc).__name__}: {exc}"
        print(f"{row.name}: {failures[row.name]}", flush=True)

    table, _ = alternate(lambda fast_port, drip, _workdir: rows(fast_port, drip, pieces),
                         args.rounds, args.seconds, args.streams, on_error=failed)
    publish(report([r for r in table if r.results], args.rounds, args.seconds, failures),
            args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
