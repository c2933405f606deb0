"""A private Redis server for the tests: Debian's `redis-server` package, on 127.0.0.1 and a
free port, no persistence, in a temporary directory, stopped by its own PID.

`.ci/services` (part of the README's test command) installs the package when it is missing.
Without it the Redis tests skip, loudly; with it, a server that will not start fails them.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sidecar.devstack.harness import free_port


class RedisNotInstalled(RuntimeError):
    pass


class RedisWillNotStart(RuntimeError):
    pass


class RedisServer:
    """One redis-server process; `stop` and `start` again on the same port (a Redis outage
    and its end)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisNotInstalled("no redis-server: install Debian's redis-server package "
                                    "(.ci/services does so)")
        self._binary = binary
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="sidecar-redis-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self._dir / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        self._process = subprocess.Popen(
            [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._dir), "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RedisWillNotStart((self._dir / "server.log").read_text()[-2000:])
            if _pong(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise RedisWillNotStart("redis-server did not answer PING within 20 s")

    def stop(self) -> None:
        """Our own server only, by its PID."""
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self._process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()
