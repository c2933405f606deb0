"""The `sidecar` command line's arguments: every command, its flags and their defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from sidecar import __version__
from sidecar.dialects.apis import Dialect
from sidecar.envoy_config.addresses import DEFAULT_ADMIN_HTTP, DEFAULT_SECRETS_DIR, split_host_port

DEFAULT_LISTEN = "127.0.0.1:10000"
DEFAULT_SHADOW = "127.0.0.1:10001"
DEFAULT_EXT_PROC = "127.0.0.1:50051"
DEFAULT_ADMIN = "127.0.0.1:9901"
LOG_LEVELS = ["debug", "info", "warning", "error"]
CA_HELP = "CA file for verifying https providers (default: the system trust store)"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidecar",
        description="Envoy ext_proc sidecar that routes LLM model groups to provider targets.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                        help="sidecar log level (default: info)")
    common.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="sidecar log lines as text (default) or one JSON object each")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_text, parents=[common])

    up = command("up",
                 "run the embedded stack: sidecar + Envoy (+ demo providers without --config)")
    up.add_argument("--config", type=Path, help="routing configuration (default: the demo)")
    _address_flags(up)
    up.add_argument("--ca-bundle", help=CA_HELP)
    up.add_argument("--demo-port", type=int, default=18080,
                    help="port of the demo providers (default: 18080; 0 picks a free port)")
    up.add_argument("--demo-token", default="demo-caller-token",
                    help="caller token the demo configuration accepts")
    up.add_argument("--demo-providers", action="store_true",
                    help="with --config: run the demo providers too, and set the demo token "
                         "and provider key for the configuration's {env} references, so an "
                         "edited copy of `sidecar demo-config` runs (live reload included)")
    up.add_argument("--no-demo-traffic", action="store_true",
                    help="the demo without its traffic and drift: providers that answer at "
                         "once, and no requests but yours (docs/console.md)")
    up.add_argument("--demo-traffic-rate", type=float, default=3.0, metavar="PER_SECOND",
                    help="requests a second the demo traffic sends on average (default: 3)")
    up.add_argument("--demo-drift-after", type=float, default=60.0, metavar="SECONDS",
                    help="when the demo's drift starts: baseten slows down and fails for 90 s, "
                         "every 10 minutes (default: 60)")
    up.add_argument("--envoy-log-level", default="warning")
    up.add_argument("--log-decisions", action="store_true",
                    help="log one JSON line per routing decision (safe scalars only)")
    up.add_argument("--admin-http", default=DEFAULT_ADMIN_HTTP, type=host_port,
                    help=f"sidecar admin HTTP endpoint (default: {DEFAULT_ADMIN_HTTP})")
    up.add_argument("--admin-token-file", type=Path, help=ADMIN_TOKEN_HELP)
    _replay_reports_flag(up)
    _grpc_server_flag(up)
    _drain_flag(up, 10.0, "; ends early once Envoy has no request left")
    up.add_argument("--drain-grace-seconds", type=float, default=2.0,
                    help="on SIGTERM, after GET /ready on the client listener starts "
                         "answering 503: serve this long before the drain may end, so a load "
                         "balancer notices (default: 2; part of --drain-seconds)")
    _replica_flag(up)

    serve = command("serve", "run only the ext_proc gRPC server (containers)")
    serve.add_argument("--config", type=Path, required=True)
    serve.add_argument("--listen", default=DEFAULT_EXT_PROC, type=host_port,
                       help=f"gRPC address (default: {DEFAULT_EXT_PROC})")
    serve.add_argument("--grpc-token-file", type=Path, required=True,
                       help="file with the channel token Envoy presents on every gRPC call "
                            "(the file given to render-envoy --grpc-token-file)")
    serve.add_argument("--log-decisions", action="store_true",
                       help="log one JSON line per routing decision (safe scalars only)")
    serve.add_argument("--admin-http", default=DEFAULT_ADMIN_HTTP, type=host_port,
                       help=f"admin HTTP endpoint (default: {DEFAULT_ADMIN_HTTP})")
    serve.add_argument("--admin-token-file", type=Path, help=ADMIN_TOKEN_HELP)
    serve.add_argument("--xds-dir", type=Path,
                       help="the folder given to `render-envoy --xds-dir`: on every reload "
                            "the sidecar writes Envoy's new clusters and listener there")
    serve.add_argument("--envoy-shadow", type=host_port,
                       help="Envoy's shadow listener (render-envoy --shadow-listen): where "
                            "groups' rollout.shadow_traffic is sent; without it, none is")
    serve.add_argument("--envoy-admin", type=host_port,
                       help="Envoy's admin address: with --xds-dir, a reload waits until "
                            "Envoy has the new clusters before routing to them")
    _replay_reports_flag(serve)
    _grpc_server_flag(serve)
    _drain_flag(serve, 10.0, "")
    _replica_flag(serve)

    observations = command("observations",
                           "show each target's observation window from a running sidecar")
    observations.add_argument("--admin-http", default=DEFAULT_ADMIN_HTTP, type=host_port,
                              help=f"the sidecar's admin endpoint (default: {DEFAULT_ADMIN_HTTP})")
    observations.add_argument("--window", type=int, help="seconds (default: the longest)")
    observations.add_argument("--admin-token-file", type=Path,
                              help="the admin token, when the endpoint requires one")
    observations.add_argument("--format", choices=["table", "json"], default="table")

    health = command("health", "exit 0 when a running sidecar's gRPC health is SERVING "
                               "(container health checks)")
    health.add_argument("--grpc", default=DEFAULT_EXT_PROC, type=host_port,
                        help=f"the sidecar's gRPC address (default: {DEFAULT_EXT_PROC})")
    health.add_argument("--service", default="",
                        help="the service to ask about (default: the server as a whole)")
    health.add_argument("--timeout", type=float, default=2.0)

    check = command("check-config", "validate a configuration file")
    check.add_argument("file", type=Path)
    check.add_argument("--secrets", action="store_true",
                       help="also check that every caller token and provider key can be read")

    render = command("render-envoy", "print the Envoy bootstrap for a config")
    render.add_argument("--config", type=Path, required=True)
    _address_flags(render)
    render.add_argument("--ca-bundle", help=CA_HELP)
    render.add_argument("--output", type=Path, help="write here instead of stdout")
    render.add_argument("--grpc-token-file", type=Path,
                        help="channel token Envoy sends to the sidecar (created with a new "
                             "random token if the file does not exist); without it, a "
                             "placeholder is rendered")
    render.add_argument("--secrets-dir", default=DEFAULT_SECRETS_DIR,
                        help="where Envoy finds the providers' SDS files "
                             f"(default: {DEFAULT_SECRETS_DIR})")
    render.add_argument("--sds-output", type=Path,
                        help="also write the SDS files (one per provider, naming its key's "
                             "variable or file) into this folder")
    render.add_argument("--xds-dir", type=Path,
                        help="render a bootstrap that reads the target clusters and the "
                             "listener from watched files in this folder, and write them "
                             "there; `sidecar serve --xds-dir` keeps them in step with "
                             "reloads (docs/reload.md)")
    render.add_argument("--format", choices=["yaml", "json"], default="yaml",
                        help="bootstrap format (JSON renders a configuration of thousands "
                             "of targets several times faster)")

    istio = command("render-istio", "print an EnvoyFilter that routes one host of an Istio "
                                    "ingress gateway through the sidecar (docs/deploy.md)")
    istio.add_argument("--config", type=Path, required=True)
    istio.add_argument("--host", required=True,
                       help="the gateway's virtual host, as Istio names it: host:port")
    istio.add_argument("--gateway-label", action="append", default=[], metavar="KEY=VALUE",
                       help="a label of the gateway pods (default: istio=ingressgateway)")
    istio.add_argument("--ext-proc", required=True, type=host_port,
                       help="where the gateway reaches the sidecar's gRPC port (its Service)")
    istio.add_argument("--secrets-dir", default=DEFAULT_SECRETS_DIR,
                       help="where the gateway pods have the providers' SDS files")
    istio.add_argument("--ca-bundle", help=CA_HELP)
    istio.add_argument("--grpc-token-file", type=Path,
                       help="channel token the gateway presents to the sidecar")
    istio.add_argument("--namespace", default="istio-system")
    istio.add_argument("--output", type=Path, help="write here instead of stdout")

    explain = command("explain", "show the routing decision for one request body, and why")
    explain.add_argument("--config", type=Path, required=True)
    explain.add_argument("--request", type=Path, required=True,
                         help="JSON request body (its 'model' is the group)")
    explain.add_argument("--api", choices=[d.value for d in Dialect], default="openai_chat",
                         help="the caller's API dialect (default: openai_chat)")
    explain.add_argument("--observations", type=Path,
                         help="observation snapshot (JSON, see docs/dynamic-score.md)")
    explain.add_argument("--caller", help="caller name, for its spend ceiling")
    explain.add_argument("--format", choices=["table", "json"], default="table")

    rollout = command("rollout", "roll out a routing change (docs/rollout.md)")
    rollout_commands = rollout.add_subparsers(dest="rollout_command", required=True,
                                              metavar="SUBCOMMAND")
    check = rollout_commands.add_parser(
        "check", help="run the SPEC's rollout checklist against a live group, as a caller")
    check.add_argument("--config", type=Path, required=True,
                       help="the configuration the gateway runs (what should happen)")
    check.add_argument("--group", required=True, help="the model group to check")
    check.add_argument("--url", default=f"http://{DEFAULT_LISTEN}",
                       help=f"the client listener (default: http://{DEFAULT_LISTEN})")
    check.add_argument("--admin", default=f"http://{DEFAULT_ADMIN_HTTP}",
                       help="the sidecar's admin endpoint, where the check reads back each "
                            f"request's row (default: http://{DEFAULT_ADMIN_HTTP})")
    token = check.add_mutually_exclusive_group(required=True)
    token.add_argument("--token-file", type=Path, help="file with a caller token")
    token.add_argument("--token-env", help="environment variable with a caller token")
    second = check.add_mutually_exclusive_group()
    second.add_argument("--second-token-file", type=Path,
                        help="another caller's token, for the caller-isolation item")
    second.add_argument("--second-token-env",
                        help="environment variable with another caller's token")
    check.add_argument("--admin-token-file", type=Path,
                       help="the admin endpoint's token, when it is bound beyond loopback")
    check.add_argument("--wait-ttl", action="store_true",
                       help="run the TTL-expiry item: a hit half a TTL in, then a turn once "
                            "the pin's TTL (from its creation) has passed")
    check.add_argument("--row-wait-seconds", type=float, default=20.0,
                       help="how long a request's row may take to be written and read back "
                            "(default: 20)")
    check.add_argument("--format", choices=["table", "json"], default="table")

    reports = command("report", "usage, decision and fallback reports from the telemetry "
                                "database (docs/telemetry.md)")
    reports.add_argument("kind", choices=["usage", "decisions", "fallbacks"])
    source = reports.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path,
                        help="the telemetry database its telemetry section names")
    source.add_argument("--db", type=Path, help="a telemetry SQLite file")
    reports.add_argument("--since", default="24h", help="period start, ago (default: 24h)")
    reports.add_argument("--until", help="period end, ago (default: now)")
    reports.add_argument("--group")
    reports.add_argument("--caller")
    reports.add_argument("--by", choices=["target", "caller", "group", "day"],
                         default="target")
    reports.add_argument("--format", choices=["table", "json", "csv"], default="table")

    replays = command("replay", "re-decide a logged window under a candidate configuration "
                                "and estimate its cost, latency and errors "
                                "(docs/policy-evaluation.md)")
    replays.add_argument("--config", type=Path, required=True,
                         help="the candidate configuration")
    replays.add_argument("--db", type=Path,
                         help="a telemetry SQLite file (default: the database the candidate's "
                              "telemetry section names)")
    replays.add_argument("--since", default="24h", help="period start, ago (default: 24h)")
    replays.add_argument("--until", help="period end, ago (default: now)")
    replays.add_argument("--group", help="only this group")
    replays.add_argument("--format", choices=["table", "json", "html"], default="table")
    replays.add_argument("--out", type=Path, help="write the report to this file")
    replays.add_argument("--confidence", type=float, default=0.95,
                         help="interval level, 0.5 to 0.999 (default: 0.95)")
    progress = replays.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="a progress bar on standard error (default: on a terminal)")
    progress.add_argument("--no-progress", dest="progress", action="store_false")

    rollup = command("rollup", "roll up finished days and expire raw telemetry rows past "
                               "raw_retention_days (docs/telemetry.md; the sidecar also does "
                               "this on a schedule)")
    rollup_source = rollup.add_mutually_exclusive_group(required=True)
    rollup_source.add_argument("--config", type=Path,
                               help="the telemetry database its telemetry section names")
    rollup_source.add_argument("--db", type=Path, help="a telemetry SQLite file")
    rollup.add_argument("--raw-retention-days", type=int,
                        help="override telemetry.raw_retention_days (default: 30)")

    providers = command("demo-providers", "run only the demo providers")
    providers.add_argument("--listen", default="127.0.0.1:18080", type=host_port)
    providers.add_argument("--api-key-env", default="SIDECAR_DEMO_PROVIDER_KEY",
                           help="environment variable holding the key the providers require")
    providers.add_argument("--behaviour", action="append", default=[], metavar="PROVIDER=NAME",
                           help="make one demo provider behave as a real one does, by the "
                                "name of sidecar/devstack/provider_behaviours.py (e.g. "
                                "baseten=openai_rate_limited); repeatable; "
                                "--behaviour list prints the names")

    traffic = command("demo-traffic", "send the demo's mix of requests to a running stack "
                                      "(docs/console.md)")
    traffic.add_argument("--url", default="http://127.0.0.1:10000",
                         help="the client listener (default: http://127.0.0.1:10000)")
    traffic.add_argument("--token-env", default="SIDECAR_DEMO_TOKEN",
                         help="environment variable holding the caller token (default: "
                              "SIDECAR_DEMO_TOKEN; unset: the demo's token)")
    traffic.add_argument("--rate", type=float, default=3.0,
                         help="requests a second on average (default: 3)")
    traffic.add_argument("--requests", type=int, help="stop after this many (default: never)")
    traffic.add_argument("--seed", type=int, default=0)

    demo_config = command("demo-config", "print the demo configuration")
    demo_config.add_argument("--providers-url", default="http://127.0.0.1:18080",
                             help="where the demo providers listen")
    demo_config.add_argument("--telemetry-db", type=Path,
                             help="where its telemetry goes (default: the demo's database in "
                                  "$XDG_STATE_HOME/model-group-sidecar, or "
                                  "~/.local/state/model-group-sidecar)")
    return parser


def host_port(value: str) -> str:
    """argparse type: a host:port address."""
    try:
        split_host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _replay_reports_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replay-reports", type=Path, metavar="DIR",
                        help="a folder where `sidecar replay --format json --out` reports are "
                             "written: the console's errors page lists the newest "
                             "(docs/console.md)")


def _replica_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replica",
                        help="the name this replica writes in its telemetry rows (default: "
                             "$SIDECAR_REPLICA, else telemetry.replica, else the host name)")


def _drain_flag(parser: argparse.ArgumentParser, default: float, note: str) -> None:
    parser.add_argument("--drain-seconds", type=float, default=default,
                        help="on SIGTERM: health NOT_SERVING at once, then keep serving this "
                             f"long before stopping (default: {default:g}{note}); SIGINT "
                             "stops at once")


def _grpc_server_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grpc-server", choices=["own", "grpcio"], default="own",
                        help="what serves the gRPC port: the sidecar's own HTTP/2 server "
                             "(default) or grpcio, the escape hatch (same handlers, more CPU "
                             "per request; docs/grpc-server.md)")


def _address_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=DEFAULT_LISTEN, type=host_port,
                        help=f"Envoy listener for clients (default: {DEFAULT_LISTEN})")
    parser.add_argument("--ext-proc", default=DEFAULT_EXT_PROC, type=host_port,
                        help=f"sidecar gRPC address (default: {DEFAULT_EXT_PROC})")
    parser.add_argument("--admin", default=DEFAULT_ADMIN, type=host_port,
                        help=f"Envoy admin address (default: {DEFAULT_ADMIN})")
    parser.add_argument("--shadow-listen", default=DEFAULT_SHADOW, type=host_port,
                        help="Envoy's listener for the sidecar's shadow traffic, rendered only "
                             "when a group has rollout.shadow_traffic; only the sidecar should "
                             f"reach it (default: {DEFAULT_SHADOW}; docs/rollout.md §4)")


ADMIN_TOKEN_HELP = ("file with a token (32+ characters) the admin endpoint requires as "
                    "'authorization: Bearer <token>' on all but /healthz; needed when "
                    "--admin-http is not a loopback address")


