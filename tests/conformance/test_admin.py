"""The admin endpoint (sidecar/operations/admin.py) under slow peers: the request-head
timeout is short, and `/healthz` is still answered when every connection slot is held by
slow peers."""

from __future__ import annotations

import asyncio
import socket
import threading

from sidecar.observe.store import ObservationStore
from sidecar.operations import admin
from sidecar.operations.admin import AdminServer


def test_healthz_is_answered_while_slow_peers_hold_every_slot() -> None:
    assert admin.HEAD_TIMEOUT <= 2
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = AdminServer(ObservationStore(retention_seconds=60, slice_seconds=10,
                                          refresh_seconds=0), "127.0.0.1", 0)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    slow = []
    try:
        for _ in range(admin.MAX_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"GET /status HTTP/1.1\r\n")  # and never the end of the head
            slow.append(sock)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), loop).result(10)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as probe:
            probe.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            answer = b""
            while chunk := probe.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer
        assert answer.endswith(b'"ok"')
    finally:
        for sock in slow:
            sock.close()
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
