"""Harness for end-to-end tests and benchmarks: free loopback ports, a provider server on a
background thread, and `sidecar up` as a child process whose banner is parsed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path

from sidecar.devstack.providers import Behaviour, FakeProvider, ProviderServer


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out by itself (outgoing connections, bind to 0)."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now, for a process started later. Taken *below* the kernel's
    ephemeral range: a port from bind(0) could be handed by the kernel to any outgoing
    connection before its server binds it (a CI run lost a replica's listener that way),
    one below the range never is. Never the same port twice in this process."""
    floor = _ephemeral_floor()
    low = max(1024, floor - 12_000)
    for _ in range(200):
        port = random.randrange(low, floor)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as sock:  # a crowded range: the kernel's choice after all
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ProviderThread:
    """A ProviderServer on its own event loop in a daemon thread."""

    def __init__(self, providers: list[FakeProvider]) -> None:
        self.server = ProviderServer(providers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ProviderThread:
        self._thread.start()
        self._run(self.server.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self.server.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self, coroutine) -> object:
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(10)

    def base_url(self, name: str) -> str:
        return self.server.base_url(name)

    def provider(self, name: str) -> FakeProvider:
        return self.server.providers[name]

    def clear(self) -> None:
        for provider in self.server.providers.values():
            provider.received.clear()

    def reset(self) -> None:
        """Forget what was received and restore every provider's default behaviour."""
        self.clear()
        for provider in self.server.providers.values():
            provider.behaviour = Behaviour()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class UpProcess:
    """`python -m sidecar up ...` as a child process; parses its banner."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None = None,
                 log_path: Path | None = None) -> None:
        self.listen_port = free_port()
        self.admin_port = free_port()
        self.ext_proc_port = free_port()
        self.admin_http_port = free_port()
        self.shadow_port = free_port()
        self.args = [
            sys.executable, "-m", "sidecar", "up",
            "--listen", f"127.0.0.1:{self.listen_port}",
            "--admin", f"127.0.0.1:{self.admin_port}",
            "--ext-proc", f"127.0.0.1:{self.ext_proc_port}",
            "--admin-http", f"127.0.0.1:{self.admin_http_port}",
            "--shadow-listen", f"127.0.0.1:{self.shadow_port}",
            *args,
        ]
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.banner: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def start(self, timeout: float = 60) -> UpProcess:
        stderr = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                code = self.process.poll()
                raise RuntimeError(f"sidecar up exited early ({code}); see {self.log_path}")
            self.banner.append(line.rstrip("\n"))
            if line.startswith("Press Ctrl-C"):
                return self
        raise RuntimeError("sidecar up did not print its banner in time")

    def banner_value(self, pattern: str) -> str:
        for line in self.banner:
            match = re.search(pattern, line)
            if match:
                return match.group(1)
        raise AssertionError(f"{pattern!r} not in banner:\n" + "\n".join(self.banner))

    @property
    def envoy_pid(self) -> int:
        return int(self.banner_value(r"envoy pid (\d+)"))

    def interrupt(self, timeout: float = 20) -> int:
        """Ctrl-C as a terminal sends it (SIGINT to the whole process group); wait for exit."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGINT)
        code = self.process.wait(timeout)
        assert self.process.stdout is not None
        self.banner.extend(self.process.stdout.read().splitlines())
        return code

    @contextlib.contextmanager
    def running(self) -> Iterator[UpProcess]:
        """Started on entry; Ctrl-C'd (and, failing that, killed) on exit."""
        try:
            yield self.start()
        finally:
            if self.process is not None and self.process.poll() is None:
                self.interrupt()
            self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def keyed_stack(workdir: Path, fakes: list[FakeProvider],
                config_text: Callable[[ProviderThread], str], keys: Mapping[str, str],
                *args: str, env: Mapping[str, str] | None = None
                ) -> Iterator[tuple[UpProcess, ProviderThread]]:
    """Fake providers and `sidecar up --config` in front of them, each provider's key in the
    variable `KEY_<NAME>` (the configuration names them so), plus `env`: what the e2e
    modules that need their own stack share."""
    with ProviderThread(fakes) as providers:
        config = workdir / "config.yaml"
        config.write_text(config_text(providers))
        env = {**{f"KEY_{name.upper()}": key for name, key in keys.items()}, **(env or {})}
        up = UpProcess(["--config", str(config), *args], env=env, log_path=workdir / "up.log")
        with up.running():
            yield up, providers
