"""Reports on the admin endpoint, and the admin token (docs/telemetry.md §6): the same JSON
as `sidecar report --format json`, checked parameters, one report at a time, and beyond
loopback nothing but /healthz without the token."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import pytest

from sidecar.config.service_settings import Telemetry
from sidecar.observe.store import ObservationStore
from sidecar.operations.admin import AdminServer, check_exposure, is_loopback
from sidecar.telemetry.admin_reports import AdminReports
from sidecar.telemetry.database import SQLiteDatabase
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import FallbackRow, request_row
from sidecar.telemetry.store import TelemetryStore

TOKEN = "admin-token-0123456789-0123456789-abc"


def seeded(tmp_path: Path) -> Telemetry:
    path = tmp_path / "t.db"
    store = TelemetryStore(SQLiteDatabase(path))
    now = time.time()
    store.write([request_row(None, RequestResult(f"r{n}", 200, "p/a", 1, "ok", 100.0 * n,
                                                 10.0, 10, 5, 0), {}, "log_only", now - 60)
                 for n in range(1, 4)],
                [FallbackRow("r1", now - 60, "", "p/b", "p/a", 1, "timeout")])
    store.close()
    return Telemetry(sqlite_path=path)


async def fetch(server: AdminServer, path: str, token: str | None = None) -> tuple[int, object]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n{auth}\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, (json.loads(body) if body[:1] in (b"{", b"[", b'"') else body.decode())


def serve(settings: Telemetry | None, token: str | None = None) -> AdminServer:
    return AdminServer(ObservationStore(), "127.0.0.1", 0, token=token,
                       reports=AdminReports(settings) if settings else None)


def test_reports_as_json_with_checked_parameters(tmp_path: Path) -> None:
    async def run() -> None:
        server = serve(seeded(tmp_path))
        await server.start()
        try:
            status, body = await fetch(server, "/reports/usage?since=1h&by=target")
            assert status == 200 and body["report"] == "usage" and body["by"] == "target"
            (row,) = body["rows"]
            assert (row["target"], row["requests"], row["input_tokens"]) == ("p/a", 3, 30)
            assert row["latency_p50_ms"] == 200.0
            status, body = await fetch(server, "/reports/fallbacks")
            assert body["rows"][0]["count"] == 1
            assert (await fetch(server, "/reports/decisions?by=caller"))[0] == 200
            for query, words in (("since=yesterday", "use a number"), ("by=planet", "by:"),
                                 ("colour=red", "unknown parameter"),
                                 ("group=" + "g" * 300, "at most 256")):
                status, body = await fetch(server, f"/reports/usage?{query}")
                assert status == 400 and words in body["error"], query
            assert (await fetch(server, "/reports/invoices"))[0] == 404
        finally:
            await server.stop()

    asyncio.run(run())


def test_a_trace_s_rows_on_the_admin_endpoint(tmp_path: Path) -> None:
    """`GET /requests?trace=`: what `sidecar rollout check` reads back (issue 42)."""
    path = tmp_path / "t.db"
    store = TelemetryStore(SQLiteDatabase(path))
    trace = "c4ec1157" + "0f" * 12
    row = request_row(None, RequestResult("r-check", 200, "p/a", 1, "ok", 10.0, 2.0, 5, 7, 0),
                      {}, "log_only", time.time() - 5)
    store.write([dataclasses.replace(row, traceparent=f"00-{trace}-{'1' * 16}-01",
                                     origin="rollout_check")], [])
    store.close()

    async def run() -> None:
        server = serve(Telemetry(sqlite_path=path), token=TOKEN)
        await server.start()
        try:
            assert (await fetch(server, f"/requests?trace={trace}"))[0] == 401
            status, body = await fetch(server, f"/requests?trace={trace}", TOKEN)
            assert status == 200 and body["trace"] == trace
            (found,) = body["rows"]
            assert (found["request_id"], found["origin"]) == ("r-check", "rollout_check")
            status, body = await fetch(server, f"/requests?trace={'ab' * 16}", TOKEN)
            assert status == 200 and body["rows"] == []
            for query, words in (("trace=%25", "trace:"), ("trace=" + trace.upper(), "trace:"),
                                 (f"trace={trace}&trace={trace}", "trace:"),
                                 (f"trace={trace}&since=-1", "since:"),
                                 (f"trace={trace}&colour=red", "unknown parameter")):
                status, body = await fetch(server, f"/requests?{query}", TOKEN)
                assert status == 400 and words in body["error"], query
        finally:
            await server.stop()

    asyncio.run(run())


def test_a_second_report_while_one_runs_is_refused(tmp_path: Path) -> None:
    async def run() -> None:
        reports = AdminReports(seeded(tmp_path))
        async with reports._running:  # one report in flight
            status, body = await reports.answer("usage", "since=1h")
        assert status == "429 Too Many Requests" and "already running" in body["error"]

    asyncio.run(run())


def test_reports_when_telemetry_is_off_or_the_database_is_away(tmp_path: Path) -> None:
    async def run() -> None:
        off = serve(None)
        away = serve(Telemetry(sqlite_path=tmp_path / "missing" / "t.db"))
        await off.start()
        await away.start()
        try:
            status, body = await fetch(off, "/reports/usage")
            assert status == 404 and "telemetry is off" in body["error"]
            status, body = await fetch(away, "/reports/usage")
            assert status == 503 and "unavailable" in body["error"]
            assert str(tmp_path) not in json.dumps(body)
        finally:
            await off.stop()
            await away.stop()

    asyncio.run(run())


def test_with_a_token_everything_but_healthz_needs_it(tmp_path: Path) -> None:
    async def run() -> None:
        server = serve(seeded(tmp_path), token=TOKEN)
        await server.start()
        try:
            assert await fetch(server, "/healthz") == (200, "ok")
            for path in ("/observations", "/metrics", "/status", "/reports/usage"):
                status, body = await fetch(server, path)
                assert status == 401 and "admin token" in body["error"], path
                assert (await fetch(server, path, "wrong" + TOKEN))[0] == 401
            assert (await fetch(server, "/reports/usage", TOKEN))[0] == 200
            assert (await fetch(server, "/observations", TOKEN))[0] == 200
        finally:
            await server.stop()

    asyncio.run(run())


def test_beyond_loopback_the_admin_endpoint_needs_a_token() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
    assert not is_loopback("admin.internal")
    check_exposure("127.0.0.1", None)
    check_exposure("0.0.0.0", TOKEN)
    with pytest.raises(ValueError, match="--admin-token-file"):
        check_exposure("0.0.0.0", None)
    with pytest.raises(ValueError, match="--admin-token-file"):
        AdminServer(ObservationStore(), "0.0.0.0", 0)
