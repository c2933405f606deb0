"""The admin endpoint answers what it can and drops what it cannot, without crashing."""

from __future__ import annotations

import asyncio
import json

from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.operations.admin import AdminServer


async def ask(raw: bytes) -> bytes:
    store = ObservationStore(refresh_seconds=0)
    store.record(Observation("p/m", Outcome.OK, latency_ms=10))
    server = AdminServer(store, "127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer
    finally:
        await server.stop()


def get(path: str) -> tuple[str, object]:
    answer = asyncio.run(ask(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode()))
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


def test_observations_and_health() -> None:
    status, body = get("/observations?window=60")
    assert status == "HTTP/1.1 200 OK"
    assert body["window_seconds"] == 60 and body["targets"]["p/m"]["count"] == 1
    assert get("/observations?window=99999999")[1]["window_seconds"] == 600  # clamped, said
    assert get("/healthz") == ("HTTP/1.1 200 OK", "ok")


def test_bad_requests_get_clear_answers() -> None:
    for window in ("%C2%B2", "-1", "0", "abc", "9" * 5000):
        status, body = get(f"/observations?window={window}")
        assert status == "HTTP/1.1 400 Bad Request", window
        assert body == {"error": "window must be a positive integer"}
    assert get("/nothing")[0] == "HTTP/1.1 404 Not Found"


def test_oversized_or_broken_requests_are_dropped_not_fatal() -> None:
    assert asyncio.run(ask(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n")) == b""
    assert asyncio.run(ask(b"POST /observations HTTP/1.1\r\n\r\n")).startswith(
        b"HTTP/1.1 405")
