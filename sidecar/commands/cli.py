"""The `sidecar` command (also `python -m sidecar`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

from sidecar import __version__
from sidecar.config import ConfigError, load_config_file
from sidecar.config.models import Telemetry
from sidecar.config.secrets import SecretError
from sidecar.dialects.apis import Dialect
from sidecar.envoy_config.addresses import (
    DEFAULT_ADMIN_HTTP,
    DEFAULT_SECRETS_DIR,
    EnvoyAddresses,
    split_host_port,
)
from sidecar.gateway import StartupError
from sidecar.grpcwire.auth import ChannelTokenError, ensure_channel_token, read_channel_token
from sidecar.operations.log_format import configure as configure_logging
from sidecar.operations.posix_signals import until_stop_signal
from sidecar.operations.process import run_event_loop

DEFAULT_LISTEN = "127.0.0.1:10000"
DEFAULT_EXT_PROC = "127.0.0.1:50051"
DEFAULT_ADMIN = "127.0.0.1:9901"
LOG_LEVELS = ["debug", "info", "warning", "error"]
CA_HELP = "CA file for verifying https providers (default: the system trust store)"


def _parser() -> argparse.ArgumentParser:
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
    up.add_argument("--envoy-log-level", default="warning")
    up.add_argument("--log-decisions", action="store_true",
                    help="log one JSON line per routing decision (safe scalars only)")
    up.add_argument("--admin-http", default=DEFAULT_ADMIN_HTTP, type=host_port,
                    help=f"sidecar admin HTTP endpoint (default: {DEFAULT_ADMIN_HTTP})")
    up.add_argument("--admin-token-file", type=Path, help=ADMIN_TOKEN_HELP)
    _grpc_server_flag(up)
    _drain_flag(up, 10.0, "; ends early once Envoy has no request left")

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
    _grpc_server_flag(serve)
    _drain_flag(serve, 10.0, "")

    observations = command("observations",
                           "show each target's observation window from a running sidecar")
    observations.add_argument("--admin-http", default=DEFAULT_ADMIN_HTTP, type=host_port,
                              help=f"the sidecar's admin endpoint (default: {DEFAULT_ADMIN_HTTP})")
    observations.add_argument("--window", type=int, help="seconds (default: the longest)")
    observations.add_argument("--admin-token-file", type=Path,
                              help="the admin token, when the endpoint requires one")
    observations.add_argument("--format", choices=["table", "json"], default="table")

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

    demo_config = command("demo-config", "print the demo configuration")
    demo_config.add_argument("--providers-url", default="http://127.0.0.1:18080",
                             help="where the demo providers listen")
    return parser


def host_port(value: str) -> str:
    """argparse type: a host:port address."""
    try:
        split_host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


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


ADMIN_TOKEN_HELP = ("file with a token (32+ characters) the admin endpoint requires as "
                    "'authorization: Bearer <token>' on all but /healthz; needed when "
                    "--admin-http is not a loopback address")


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.admin_token_file is None:
        return None
    return read_channel_token(args.admin_token_file, "admin token")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except StartupError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (SecretError, ChannelTokenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # unreadable answers from a running sidecar, and the like
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace) -> int:
    from sidecar.devstack.stack import EnvoyStartError, StackOptions, run_stack

    try:
        admin_token = _admin_token(args)
    except ChannelTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = StackOptions(
        config_path=args.config,
        addresses=EnvoyAddresses(listen=args.listen, admin=args.admin, ext_proc=args.ext_proc,
                                 ca_bundle=args.ca_bundle),
        demo_port=args.demo_port,
        demo_token=args.demo_token,
        envoy_log_level=args.envoy_log_level,
        log_decisions=args.log_decisions,
        admin_http=args.admin_http,
        grpc_server=args.grpc_server,
        admin_token=admin_token,
        drain_seconds=args.drain_seconds,
    )
    try:
        return run_event_loop(run_stack(options))
    except EnvoyStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    from sidecar.gateway import Runtime
    from sidecar.operations.assembly import start_sidecar
    from sidecar.operations.drain import drain
    from sidecar.operations.reload import enable_reload

    config = load_config_file(args.config)
    runtime = Runtime(config)
    try:
        channel_token = read_channel_token(args.grpc_token_file)
        admin_token = _admin_token(args)
    except ChannelTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        sidecar = await start_sidecar(config, runtime, args.listen, args.admin_http,
                                      args.log_decisions, channel_token=channel_token,
                                      grpc_server=args.grpc_server, admin_token=admin_token)
        enable_reload(sidecar, Path(args.config))
        logging.getLogger("sidecar").info(
            "ext_proc listening on %s, admin on http://%s:%d (%d model groups)", args.listen,
            sidecar.admin.host, sidecar.admin.port, len(config.models))
        if await until_stop_signal() == signal.SIGTERM and args.drain_seconds > 0:
            await drain(sidecar, args.drain_seconds)
        await sidecar.stop()

    run_event_loop(serve())
    return 0


def _observations(args: argparse.Namespace) -> int:
    from sidecar.commands.observations import fetch_observations, render_table

    document = fetch_observations(args.admin_http, args.window, _admin_token(args))
    print(json.dumps(document, indent=2) if args.format == "json" else render_table(document))
    return 0


def _check_config(args: argparse.Namespace) -> int:
    config = load_config_file(args.file)
    if args.secrets:
        from sidecar.gateway import Runtime
        from sidecar.gateway.runtime import provider_key_problems

        Runtime(config)
        problems = provider_key_problems(config)
        if problems:
            raise StartupError(problems)
    callers = len(config.callers)
    print(f"{args.file}: OK ({len(config.models)} model groups, {callers} callers)")
    if not callers:
        print("  note: no callers: are configured, so every request will get 401")
    return 0


def _render_envoy(args: argparse.Namespace) -> int:
    from sidecar.envoy_config.render import render_envoy_yaml

    config = load_config_file(args.config)
    addresses = EnvoyAddresses(listen=args.listen, admin=args.admin, ext_proc=args.ext_proc,
                               ca_bundle=args.ca_bundle, secrets_dir=args.secrets_dir)
    token = None
    try:
        if args.grpc_token_file is not None:
            token = ensure_channel_token(args.grpc_token_file)
    except ChannelTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if token is None:
        print("note: no --grpc-token-file: the bootstrap carries a placeholder channel token "
              "that the sidecar will refuse", file=sys.stderr)
    text = render_envoy_yaml(config, addresses, token)
    if args.sds_output is not None:
        from sidecar.envoy_config.credentials import write_sds_files

        write_sds_files(config, args.sds_output)
    if args.output:
        # Owner-only: the bootstrap carries the channel token.
        descriptor = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(descriptor, 0o600)  # also when the file already existed
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from sidecar.commands.explain import ExplainError, as_json, as_table, explain

    config = load_config_file(args.config)
    try:
        outcome = explain(config, args.request, Dialect(args.api), args.observations, args.caller)
    except ExplainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(as_json(outcome) if args.format == "json" else as_table(outcome))
    return 0


def _demo_providers(args: argparse.Namespace) -> int:
    from sidecar.devstack.demo import demo_provider_server

    host, port = split_host_port(args.listen)
    key = os.environ.get(args.api_key_env) or None

    async def serve() -> None:
        server = demo_provider_server(host, port, key)
        await server.start()
        logging.getLogger("sidecar").info("demo providers on http://%s:%d", host, server.port)
        await until_stop_signal()
        await server.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


def _demo_config(args: argparse.Namespace) -> int:
    from sidecar.devstack.demo import demo_config_text

    sys.stdout.write(demo_config_text(args.providers_url))
    return 0


def _telemetry_settings(args: argparse.Namespace) -> Telemetry | None:
    if args.db is not None:
        if not args.db.exists():
            print(f"error: no telemetry database at {args.db}", file=sys.stderr)
            return None
        return Telemetry(sqlite_path=args.db)
    settings = load_config_file(args.config).telemetry
    if not settings.enabled:
        print(f"error: {args.config} sets no telemetry.sqlite_path or telemetry.postgres_dsn",
              file=sys.stderr)
        return None
    return settings


def _report(args: argparse.Namespace) -> int:
    from sidecar.commands.report import run_report

    settings = _telemetry_settings(args)
    if settings is None:
        return 2
    print(run_report(args.kind, settings, args.since, args.until, args.group, args.caller,
                     args.by, args.format))
    return 0


def _rollup(args: argparse.Namespace) -> int:
    from sidecar.commands.report import run_rollup

    settings = _telemetry_settings(args)
    if settings is None:
        return 2
    if args.raw_retention_days is not None:
        settings = settings.model_copy(update={"raw_retention_days": args.raw_retention_days})
    print(run_rollup(settings))
    return 0


_COMMANDS = {
    "up": _up,
    "serve": _serve,
    "check-config": _check_config,
    "report": _report,
    "rollup": _rollup,
    "render-envoy": _render_envoy,
    "explain": _explain,
    "observations": _observations,
    "demo-providers": _demo_providers,
    "demo-config": _demo_config,
}
