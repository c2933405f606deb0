"""The real engine's build, overlapped with the rest of the session (issue 40).

Building llama-server from source costs minutes of CPU on a fresh machine (docs/real-engine.md),
while most of the suite waits on sockets more than it computes. So a session that will run
the engine tests starts the build in the background as soon as collection ends, at low CPU
priority (it takes the time the suite leaves idle), and runs the engine tests last: by
then the build is usually done, and the engine fixture's own `ensure_llama_server` waits on
the cache's lock for what is left. A session without engine tests builds nothing; a
session that ends first stops the build it started (by its PID's process group), and
the next one starts it again.

The build's output goes to the cache's build.log (llama_build.py); this module writes only
a one-line note of its own beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

import pytest

from sidecar.devstack.engine.llama_build import cached_llama_server, engine_dir, missing_tools

ENGINE_TESTS = "tests/e2e/engine/"
NICENESS = 10
Build = subprocess.Popen[bytes] | None


def is_engine_test(item: pytest.Item) -> bool:
    return item.nodeid.startswith(ENGINE_TESTS)


def engine_tests_last(items: list[pytest.Item]) -> None:
    """In place, stable: every other test keeps its order, the engine's go to the end."""
    items.sort(key=is_engine_test)


def start_build(items: Sequence[pytest.Item]) -> Build:
    """The background build when this session needs an engine that is not cached and the
    tools to build one are here (without them the engine fixture skips, loudly)."""
    if not any(is_engine_test(item) for item in items):
        return None
    if cached_llama_server() is not None or missing_tools():
        return None
    folder = engine_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "background.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sidecar.devstack.engine.llama_build"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=lambda: os.nice(NICENESS))


def stop_build(build: Build) -> None:
    """A build still running when the session ends is stopped (it and its compilers)."""
    if build is None or build.poll() is not None:
        return
    os.killpg(build.pid, signal.SIGTERM)
    try:
        build.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
