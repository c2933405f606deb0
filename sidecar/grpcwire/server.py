"""A small gRPC server for synchronous method handlers: listen, route calls by method path,
stop gracefully. See connection.py for why the sidecar has its own, and limits.py for what
bounds a peer."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sidecar.grpcwire.auth import OPEN_METHODS, ChannelAuth
from sidecar.grpcwire.call import HandlerFactory
from sidecar.grpcwire.connection import Connection
from sidecar.grpcwire.counters import ServerCounters
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.ratelimit import LogLimiter

log = logging.getLogger("sidecar.grpcwire")


if TYPE_CHECKING:
    from sidecar.grpcwire.health import HealthState

class GrpcServer:
    def __init__(self, limits: ServerLimits | None = None, *, auth: ChannelAuth | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 **overrides: int | float) -> None:
        """`limits` (defaults in limits.py), with any of its fields overridden by keyword,
        e.g. `GrpcServer(max_message_bytes=...)`: a larger message limit grows the buffer
        caps with it unless they are given too (ServerLimits.with_changes).

        With `auth`, every call but those of `OPEN_METHODS` (health) must carry the channel
        token in its metadata; without, every peer is trusted. `clock` paces the log rate
        limiter and the connections' flood budgets (the connection timers use the event
        loop's clock)."""
        limits = limits or ServerLimits()
        self.limits = limits.with_changes(**overrides) if overrides else limits
        self.auth = auth
        self.clock = clock
        self.open_methods = OPEN_METHODS
        self.counters = ServerCounters()
        # Set by add_health: NOT_SERVING once a drain begins (operations/drain.py).
        self.health: HealthState | None = None
        self.log = LogLimiter(log, self.limits.log_burst, self.limits.log_interval, clock,
                              self.counters)
        self.methods: dict[bytes, HandlerFactory] = {}
        # per method path: its factory, message size limit, and whether it is open to
        # peers without the channel token
        self.routes: dict[bytes, tuple[HandlerFactory, int, bool]] = {}
        self.connections: set[Connection] = set()
        # Connections that have made no authenticated call yet, oldest first (with `auth`).
        self.unauthenticated: dict[Connection, None] = {}
        # Connections that ever carried a call other than health: Envoy's (a drain without
        # an Envoy admin to ask ends once every one of them has closed: operations/drain.py).
        self.peers_seen = 0
        self.port = 0
        self._listener: asyncio.Server | None = None

    @property
    def peers_open(self) -> int:
        """Open connections that have carried a call other than health (with the channel
        token, when one is required): Envoy's. Health probes do not count."""
        return sum(1 for connection in self.connections if connection.carries_peer_calls)

    def add_method(self, service: str, method: str, factory: HandlerFactory) -> None:
        path = f"/{service}/{method}".encode()
        self.methods[path] = factory
        is_open = path in self.open_methods
        limit = (self.limits.open_method_message_bytes if is_open
                 else self.limits.max_message_bytes)
        self.routes[path] = (factory, limit, is_open)

    async def start(self, host: str, port: int) -> None:
        """Raises OSError when the address cannot be bound."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: Connection(self, loop), host, port, family=_family(host),
            reuse_address=True)
        self.port = self._listener.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new connections and calls; give calls in flight `grace` seconds."""
        if self._listener is not None:
            self._listener.close()
        for connection in list(self.connections):
            connection.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0)
        while any(c.open_calls for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        self.log.flush()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_UNSPEC
