"""A small gRPC server for synchronous method handlers: listen, route calls by method path,
stop gracefully. See connection.py for why the sidecar has its own."""

from __future__ import annotations

import asyncio
import socket

from sidecar.grpcwire.call import HandlerFactory
from sidecar.grpcwire.connection import Connection


class GrpcServer:
    def __init__(self, max_message_bytes: int = 4 * 1024 * 1024,
                 max_concurrent_calls: int = 10_000) -> None:
        """`max_concurrent_calls` bounds the calls open at once per connection (announced
        to the peer; Envoy opens another connection beyond it), and with the message limit
        the memory a peer can make us hold."""
        self.methods: dict[bytes, HandlerFactory] = {}
        self.connections: set[Connection] = set()
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_calls = max_concurrent_calls
        self.port = 0
        self._listener: asyncio.Server | None = None

    def add_method(self, service: str, method: str, factory: HandlerFactory) -> None:
        self.methods[f"/{service}/{method}".encode()] = factory

    async def start(self, host: str, port: int) -> None:
        """Raises OSError when the address cannot be bound."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: Connection(self), host, port, family=_family(host), reuse_address=True)
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


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_UNSPEC
