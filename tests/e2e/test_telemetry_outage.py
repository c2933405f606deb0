"""A stalled or unreachable telemetry database (issue #15): requests keep flowing through
real Envoy with their latency unchanged, rows are dropped and counted, the drops show in
`/metrics` and in the log, and writing resumes when the database comes back."""

from __future__ import annotations

import hashlib
import re
import socket
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from sidecar.devstack.harness import UpProcess, keyed_stack
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "outage-caller-token"
CONFIG = """\
providers:
  good: {{base_url: '{good}', credential: {{env: KEY_GOOD}}}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {telemetry}
models:
  chat:
    targets: [{{provider: good, model_ref: good-model}}]
"""
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


def stack(workdir: Path, telemetry: str, env: dict[str, str] | None = None):
    return keyed_stack(workdir, [FakeProvider("good", api_key="key-good")],
                       lambda providers: CONFIG.format(good=providers.base_url("good"),
                                                       digest=DIGEST, telemetry=telemetry),
                       {"good": "key-good", **(env or {})})


def timed_requests(up: UpProcess, n: int) -> list[float]:
    """Seconds per request, each answered 200."""
    took = []
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            started = time.perf_counter()
            answer = client.post(f"{up.base_url}/v1/chat/completions",
                                 headers={"authorization": f"Bearer {TOKEN}"},
                                 json={"model": "chat",
                                       "messages": [{"role": "user", "content": "hi"}]})
            took.append(time.perf_counter() - started)
            assert answer.status_code == 200, answer.text
    return took


def metric(up: UpProcess, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def eventually(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_a_locked_sqlite_database_costs_rows_not_latency(tmp_path: Path) -> None:
    db = tmp_path / "telemetry.db"
    with stack(tmp_path, f"{{sqlite_path: '{db}'}}") as (up, _):
        baseline = timed_requests(up, 30)
        eventually(lambda: _count(db) >= 30)
        lock = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        lock.execute("BEGIN EXCLUSIVE")  # the writer now waits 5 s per batch, then fails
        try:
            stalled = timed_requests(up, 60)
            eventually(lambda: metric(up, "sidecar_telemetry_dropped_write_error") > 0)
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        # Generous for a slow machine; a request waiting on the database would take 5 s.
        assert statistics.median(stalled) <= 3 * statistics.median(baseline) + 0.05
        assert max(stalled) < 2.0
        before = _count(db)
        timed_requests(up, 5)
        eventually(lambda: _count(db) >= before + 5)  # writing resumed
        assert metric(up, "sidecar_telemetry_dropped_queue_full") == 0
    log = (tmp_path / "up.log").read_text()
    assert "telemetry batch of" in log and "dropped" in log


def test_an_unanswering_postgres_costs_rows_not_latency(tmp_path: Path) -> None:
    """A server that accepts connections and never answers: each connection attempt holds
    the writer thread for the 5 s connect timeout, never a request. The worker then takes
    no more than its small queue; the rest waits in the sidecar's small hand-over buffer,
    and what does not fit there is dropped and counted too."""
    with blackhole() as port:
        dsn = f"postgresql://sidecar:secret-password@127.0.0.1:{port}/telemetry"
        telemetry = ("{postgres_dsn: {env: KEY_TELEMETRY_DSN}, queue_size: 20, "
                     "handoff_size: 10}")
        with stack(tmp_path, telemetry, {"telemetry_dsn": dsn}) as (up, _):
            took = timed_requests(up, 60)
            # On a loaded machine the worker may still be taking rows: more requests until
            # the hand-over buffer has overflowed (30 past its 10 + 20 usually suffice).
            while (metric(up, "sidecar_telemetry_dropped_handoff") == 0
                   and len(took) < 600):
                took += timed_requests(up, 20)
            eventually(lambda: metric(up, "sidecar_telemetry_dropped_handoff") > 0)
            eventually(lambda: metric(up, "sidecar_telemetry_dropped_write_error") > 0)
            assert httpx.get(f"http://127.0.0.1:{up.admin_http_port}/healthz").json() == "ok"
    # A request coupled to the database would wait the 5 s connect timeout.
    assert max(took) < 2.0
    log = (tmp_path / "up.log").read_text()
    assert "telemetry" in log and "secret-password" not in log


def _count(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM request_rows").fetchone()[0]


class blackhole:
    """A loopback TCP port that accepts and never says a word."""

    def __enter__(self) -> int:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        return self._server.getsockname()[1]

    def _accept(self) -> None:
        self._server.settimeout(0.1)
        while not self._stop.is_set():
            try:
                self._held.append(self._server.accept()[0])
            except TimeoutError:
                continue

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._server.close()
