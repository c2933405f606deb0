"""Fixtures and the server side of the gRPC port's conformance tests: the test methods'
handlers and a GrpcServer on its own event loop thread. The clients that talk to it are in
clients.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from sidecar.grpcwire import Call, GrpcServer
from sidecar.grpcwire.auth import ChannelAuth
from sidecar.grpcwire.health import add_health
from sidecar.grpcwire.limits import ServerLimits

SERVICE = "test.Conformance"
ECHO = f"/{SERVICE}/Echo"
HOLD = f"/{SERVICE}/Hold"
COLLECT = f"/{SERVICE}/Collect"
LINGER = f"/{SERVICE}/Linger"
HEALTH = "/grpc.health.v1.Health/Check"
MiB = 1024 * 1024


class Echo:
    """Echoes each message; finishes on the client's half-close."""

    started = 0

    def __init__(self) -> None:
        Echo.started += 1

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        call.send(bytes(payload))

    def on_half_close(self, call: Call) -> None:
        call.finish()

    def on_cancel(self) -> None:
        pass


class Hold:
    """Takes messages and never answers: the call stays open until the client ends it."""

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        pass

    def on_half_close(self, call: Call) -> None:
        call.finish()

    def on_cancel(self) -> None:
        pass


class Linger(Hold):
    """Like Hold, but stays open after the client's half-close too."""

    def on_half_close(self, call: Call) -> None:
        pass


@dataclass
class Collect:
    """Counts what it receives; answers the byte count at half-close. Records what it
    heard of, so a test can tell a clean half-close from a cancel."""

    events: list[str] = field(default_factory=list)
    total: int = 0
    log: list[list[str]] = field(default_factory=list)

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        self.total += len(payload)
        self.events.append("message")

    def on_half_close(self, call: Call) -> None:
        self.events.append("half-close")
        call.send(str(self.total).encode())
        call.finish()

    def on_cancel(self) -> None:
        self.events.append("cancel")


class ServerThread:
    """A GrpcServer on an event loop in a background thread."""

    def __init__(self, limits: ServerLimits | None = None, auth: ChannelAuth | None = None,
                 extra: Callable[[GrpcServer], None] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = GrpcServer(limits or ServerLimits(max_message_bytes=4 * MiB), auth=auth)
        self.collected: list[Collect] = []
        self.server.add_method(SERVICE, "Echo", Echo)
        self.server.add_method(SERVICE, "Hold", Hold)
        self.server.add_method(SERVICE, "Linger", Linger)
        self.server.add_method(SERVICE, "Collect", self._collect)
        add_health(self.server, [SERVICE])
        if extra is not None:
            extra(self.server)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start("127.0.0.1", 0))
        self.port = self.server.port

    def _collect(self) -> Collect:
        handler = Collect()
        self.collected.append(handler)
        return handler

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def counters(self) -> dict[str, int]:
        """A consistent snapshot, taken on the server's loop."""
        async def snapshot() -> dict[str, int]:
            return self.server.counters.as_dict()
        return self.call(snapshot())

    def wait_for(self, predicate: Callable[[dict[str, int]], bool], timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            counters = self.counters()
            if predicate(counters) or time.monotonic() > deadline:
                return counters
            time.sleep(0.02)

    def close(self) -> None:
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture()
def server() -> Iterator[ServerThread]:
    running = ServerThread()
    yield running
    running.close()
