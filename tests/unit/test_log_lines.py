"""The log lines a newcomer reads (issue #29.6): a failing dependency is named by what it
is and where (Redis at host:port, PostgreSQL at host:port/db, the external service's URL),
never by its credentials; telemetry maintenance is a sentence, not a Python repr; and no
third-party library adds a line per HTTP request at the default level."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys

import pytest

from sidecar.dependency_names import postgres_endpoint, redis_endpoint, service_url
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.telemetry.rollup import Maintenance
from tests.unit.routing.helpers import config

SECRET = "s3cret-pw"


def closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_dependencies_are_named_by_what_and_where_never_by_their_credentials() -> None:
    assert redis_endpoint(f"redis://:{SECRET}@cache.internal:6380/0") == (
        "Redis at cache.internal:6380")
    assert redis_endpoint(f"rediss://app:{SECRET}@10.0.0.7") == "Redis at 10.0.0.7:6379"
    assert redis_endpoint(f"unix://:{SECRET}@/run/redis.sock?db=1") == (
        "Redis at socket /run/redis.sock")
    assert postgres_endpoint(f"postgresql://app:{SECRET}@db.internal:5433/telemetry"
                             "?sslmode=require") == "PostgreSQL at db.internal:5433/telemetry"
    assert postgres_endpoint(f"host=db.internal dbname=telemetry user=app "
                             f"password='{SECRET} x'") == "PostgreSQL at db.internal:5432/telemetry"
    assert service_url(f"http://u:{SECRET}@127.0.0.1:9000/rank?key={SECRET}#x") == (
        "http://127.0.0.1:9000/rank")
    assert service_url("grpc://[::1]:9000") == "grpc://[::1]:9000"
    assert redis_endpoint("redis://host:port") == "Redis"  # unreadable: the kind only


def test_an_unreachable_quota_store_is_named_redis_at_host_port(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """It said only `quota store unreachable (ConnectionError)`."""
    from sidecar.quotas import shared
    from sidecar.quotas.counters import QuotaCounters
    from tests.clock import ManualClock
    from tests.unit.quotas.test_counters import CALLERS, GROUPS, MIDNIGHT

    monkeypatch.setattr(shared, "_limited", LogLimiter(shared.log, burst=3, interval=60.0))
    cfg = config(GROUPS + CALLERS)
    port = closed_port()
    reconciler = shared.RedisReconciler(QuotaCounters(cfg, ManualClock(MIDNIGHT)),
                                        cfg.quotas, f"redis://:{SECRET}@127.0.0.1:{port}/0")

    async def round_against_nobody() -> bool:
        try:
            return await reconciler.reconcile()
        finally:
            await reconciler.close()

    with caplog.at_level(logging.WARNING, "sidecar.quotas"):
        assert not asyncio.run(round_against_nobody())
    assert f"quota store Redis at 127.0.0.1:{port} unreachable (" in caplog.text
    assert SECRET not in caplog.text


def test_a_failing_external_service_is_named_by_its_url_without_query(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sidecar.external import client
    from sidecar.external.v1.router_pb2 import RankRequest

    monkeypatch.setattr(client, "_limited", LogLimiter(client.log, burst=10, interval=60.0))
    port = closed_port()
    cfg = config(f"""
  g:
    strategy: external
    targets: [{{provider: p, model_ref: a}}]
    external: {{url: 'http://127.0.0.1:{port}/rank?key={SECRET}', timeout_ms: 1000}}
""")
    calls = client.ExternalCalls.for_config(cfg)
    assert calls is not None

    async def ask() -> str | None:
        try:
            return (await calls.ask("g", RankRequest())).failure
        finally:
            await calls.close()

    with caplog.at_level(logging.WARNING, "sidecar.external"):
        assert asyncio.run(ask()) == "error"
    assert f"external routing service of group g (http://127.0.0.1:{port}/rank): " in caplog.text
    assert SECRET not in caplog.text


def test_telemetry_store_failures_name_the_database(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """They said `telemetry store cannot be opened yet`, not which store."""
    from sidecar.telemetry import writer as writer_module
    from sidecar.telemetry.postgres import PostgresDatabase

    database = PostgresDatabase(f"postgresql://app:{SECRET}@db.internal:5433/telemetry")
    assert database.where == "PostgreSQL at db.internal:5433/telemetry"

    class Unreachable:
        where = database.where

        def open(self) -> None:
            raise OSError("connection refused")

        def values(self, row: object) -> tuple[bool, tuple[object, ...]]:
            return True, ()

        def write_values(self, requests: object, fallbacks: object) -> None:
            raise OSError("connection refused")

        def close(self) -> None:
            pass

        def maintain(self, now: float) -> Maintenance:
            raise OSError("connection refused")

    monkeypatch.setattr(writer_module, "_limited",
                        LogLimiter(writer_module.log, burst=1, interval=60.0))
    with caplog.at_level(logging.ERROR, "sidecar.telemetry"):
        writer = writer_module.TelemetryWriter(Unreachable(), flush_interval_s=0.01,
                                               maintenance_interval_s=60,
                                               first_maintenance_s=0).start()
        writer.offer(object())
        writer.close()
    lines = [record.getMessage() for record in caplog.records]
    assert ("telemetry store (PostgreSQL at db.internal:5433/telemetry) cannot be opened yet"
            in lines), lines
    assert ("telemetry rollup/retention on PostgreSQL at db.internal:5433/telemetry failed"
            in lines), lines
    assert ("telemetry batch of 1 rows dropped (PostgreSQL at db.internal:5433/telemetry did "
            "not take it)" in lines), lines
    assert SECRET not in caplog.text


def test_telemetry_maintenance_is_logged_as_a_sentence(
        caplog: pytest.LogCaptureFixture) -> None:
    """It was logged as `telemetry maintenance: Maintenance(rolled_up=[], ...)`."""
    from sidecar.telemetry.writer import TelemetryWriter

    class Maintained:
        where = "SQLite at /tmp/t.db"

        def open(self) -> None:
            pass

        def values(self, row: object) -> tuple[bool, tuple[object, ...]]:
            return True, ()

        def write_values(self, requests: object, fallbacks: object) -> None:
            pass

        def close(self) -> None:
            pass

        def maintain(self, now: float) -> Maintenance:
            return Maintenance(rolled_up=["2026-01-02"], expired=["2025-11-01", "2025-11-02"],
                               raw_rows_deleted=12)

    with caplog.at_level(logging.INFO, "sidecar.telemetry"):
        writer = TelemetryWriter(Maintained(), flush_interval_s=0.01, maintenance_interval_s=60,
                                 first_maintenance_s=0).start()
        writer.close()
    assert ("telemetry maintenance: rolled up 1 day (2026-01-02), expired 2 days "
            "(2025-11-01 to 2025-11-02), deleted 12 raw rows") in caplog.text
    assert "Maintenance(" not in caplog.text
    assert str(Maintenance(skipped_locked=True)) == (
        "rolled up 0 days, expired 0 days, deleted 0 raw rows; another replica is rolling "
        "up, the rest is left to it")


HTTP_REQUEST_SCRIPT = """
import http.server, logging, sys, threading
import httpx
from sidecar.operations.log_format import configure

class Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass

configure(sys.argv[1], "text")
server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
threading.Thread(target=server.serve_forever, daemon=True).start()
httpx.get(f"http://127.0.0.1:{server.server_port}/clusters")
logging.getLogger("sidecar.test").warning("request done")
server.shutdown()
"""


@pytest.mark.parametrize("level", ["info", "debug"])
def test_an_http_request_adds_no_line_of_httpx_or_httpcore(level: str) -> None:
    """An `INFO httpx HTTP Request: ...` line for every external call and `/clusters`
    poll; at debug, httpcore's lines carry request headers (an admin token)."""
    done = subprocess.run([sys.executable, "-c", HTTP_REQUEST_SCRIPT, level],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "request done" in done.stderr  # the sidecar's own lines still come out
    assert "httpx" not in done.stderr and "httpcore" not in done.stderr, done.stderr
    assert "HTTP Request" not in done.stderr
