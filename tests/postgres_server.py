"""A private PostgreSQL server for the tests: Debian's `postgresql` package, a throwaway
cluster in a temporary directory, listening on 127.0.0.1 only, stopped by its own PID.

`.ci/services` (part of the README's test command) installs the package when it is missing.
Without it the PostgreSQL tests skip, loudly; with it, a server that will not start fails
them. SIDECAR_TEST_POSTGRES_DSN points the tests at an existing server instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sidecar.devstack.harness import free_port

DSN_ENV = "SIDECAR_TEST_POSTGRES_DSN"


class PostgresNotInstalled(RuntimeError):
    pass


class PostgresWillNotStart(RuntimeError):
    pass


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PostgresNotInstalled("no initdb: install Debian's postgresql package "
                               "(.ci/services does so)")


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields an admin DSN (superuser `sidecar`, no password, loopback TCP)."""
    if os.environ.get(DSN_ENV):
        yield os.environ[DSN_ENV]
        return
    bin_dir = _binaries()
    root = Path(tempfile.mkdtemp(prefix="sidecar-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresWillNotStart("running as root and no 'postgres' user") from None
        os.chown(root, user.pw_uid, user.pw_gid)
        os.chown(sockets, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    log = root / "server.log"
    try:
        subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "sidecar",
                        "-A", "trust", "--no-sync", "-E", "UTF8"],
                       check=True, capture_output=True, timeout=120)
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresWillNotStart(f"initdb failed: {exc}") from None
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1",
             "-p", str(port), "-k", str(sockets), "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(bin_dir, port, server, log)
        yield f"postgresql://sidecar@127.0.0.1:{port}/postgres"
    finally:
        _stop(server)
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(bin_dir: Path, port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise PostgresWillNotStart(f"postgres exited: {log.read_text()[-2000:]}")
        ready = subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p",
                                str(port), "-q"], check=False)
        if ready.returncode == 0:
            return
        time.sleep(0.1)
    _stop(server)
    raise PostgresWillNotStart("postgres did not become ready within 60 s")


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Our own server only, by its PID (runuser passes signals on to postgres)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


@contextmanager
def fresh_database(admin_dsn: str) -> Iterator[str]:
    """A new empty database on the server for one test; dropped afterwards."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield admin_dsn.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
