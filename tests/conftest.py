"""Fixtures shared by unit and end-to-end tests: the private PostgreSQL and Redis servers."""

from __future__ import annotations

import gc
import os
import tempfile
import warnings
from collections.abc import Iterator

import pytest

from tests import engine_prebuild
from tests.postgres_server import PostgresNotInstalled, fresh_database, postgres_server
from tests.redis_server import RedisNotInstalled, RedisServer, redis_server

# The demo stack keeps its telemetry and files in $XDG_STATE_HOME (devstack/demo.py): the
# tests' demo stacks write to a folder of their own, never to the user's.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="sidecar-tests-state-")


_ENGINE_BUILD = pytest.StashKey[engine_prebuild.Build]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-engine tests run last, so their engine's build overlaps everything else."""
    engine_prebuild.engine_tests_last(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The real engine's build starts in the background when this session needs it
    (tests/engine_prebuild.py).

    The fake providers of the end-to-end tests run on threads of this process, so a full
    collection of its heap holds their replies back; what collection built (every test
    module, hypothesis, the SDKs) lives to the end, so it is frozen out of those scans."""
    session.stash[_ENGINE_BUILD] = engine_prebuild.start_build(session.items)
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    engine_prebuild.stop_build(session.stash.get(_ENGINE_BUILD, None))


@pytest.fixture(scope="session")
def postgres_admin_dsn() -> Iterator[str]:
    """A running PostgreSQL for this session (started on first use). Not installed: a loud
    skip. Installed but will not start: the tests fail (PostgresWillNotStart)."""
    try:
        with postgres_server() as dsn:
            yield dsn
    except PostgresNotInstalled as exc:
        _skip_loudly("PostgreSQL", exc)


@pytest.fixture
def postgres_dsn(postgres_admin_dsn: str) -> Iterator[str]:
    """An empty database of its own for one test."""
    with fresh_database(postgres_admin_dsn) as dsn:
        yield dsn


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A private Redis for one test (tests may stop and start it). Not installed: a loud
    skip. Installed but will not start: the tests fail (RedisWillNotStart)."""
    try:
        with redis_server() as server:
            yield server
    except RedisNotInstalled as exc:
        _skip_loudly("Redis", exc)


def _skip_loudly(server: str, why: Exception) -> None:
    """A server that is not installed skips its tests, with a warning in the summary."""
    warnings.warn(f"{server} tests SKIPPED: {why}", stacklevel=2)
    pytest.skip(f"{server} is not installed here: {why}")
