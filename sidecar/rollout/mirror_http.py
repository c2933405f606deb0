"""The mirror's HTTP/1.1 client to Envoy's shadow listener: small on purpose.

The mirror runs on the sidecar's event loop beside ext_proc, so its CPU is the live path's
cost (bench/shadow_traffic_cost.py). httpx spent about 1.2 ms of the loop's CPU per
mirrored request there; this client writes one request and reads one reply on a kept-alive
connection (RFC 9112: a status line, header fields, then a body of `content-length`, or
chunked, or until the connection closes), and nothing more: one peer (Envoy, on the
address the sidecar was given), no redirects, no proxies, no TLS, no compression.

Bounded: idle connections at most `max_idle`; a reply's body read up to `max_bytes`
(past it the connection is closed, not reused); header fields at most MAX_HEAD_BYTES.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 << 10
SHADOW_REFUSED_HEADER = "x-sidecar-shadow-refused"  # envoy_contract's, as received


class ReplyError(Exception):
    """The reply broke off or was not HTTP/1.1 as written."""


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    first_byte_at: float | None    # the clock when the body's first bytes arrived
    truncated: bool                # longer than max_bytes: the rest was not read
    refused_by_listener: bool = False  # Envoy's own 403 (SHADOW_REFUSED_HEADER)


class LoopbackClient:
    def __init__(self, host: str, port: int, max_idle: int = 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._host, self._port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._max_idle = max_idle
        self._clock = clock

    async def post(self, path: str, headers: dict[str, str], body: bytes,
                   max_bytes: int) -> Reply:
        reader, writer = await self._connection()
        try:
            head = [f"POST {path} HTTP/1.1", f"host: {self._host}",
                    f"content-length: {len(body)}"]
            head += [f"{name}: {value}" for name, value in headers.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            status, fields = await _head(reader)
            if status in (204, 304) or 100 <= status < 200:  # no body (RFC 9112 §6.3)
                reply, reusable = Reply(status, b"", None, False), True
            else:
                reply, reusable = await _body(reader, fields, max_bytes, self._clock)
            reply.status = status
            reply.refused_by_listener = SHADOW_REFUSED_HEADER in fields
        except BaseException:
            writer.close()
            raise
        if reusable and fields.get("connection", "").lower() != "close" \
                and len(self._idle) < self._max_idle:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return reply

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self._host, self._port)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    line = await reader.readline()
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ReplyError("not an HTTP/1.1 status line")
    fields: dict[str, str] = {}
    size = len(line)
    while True:
        line = await reader.readline()
        size += len(line)
        if size > MAX_HEAD_BYTES or not line:
            raise ReplyError("header fields too long or cut")
        if line in (b"\r\n", b"\n"):
            return int(parts[1]), fields
        name, _, value = line.decode("latin-1").partition(":")
        fields[name.strip().lower()] = value.strip()


async def _body(reader: asyncio.StreamReader, fields: dict[str, str], max_bytes: int,
                clock: Callable[[], float]) -> tuple[Reply, bool]:
    """The body, and whether the connection can carry another request."""
    body = bytearray()
    first: float | None = None

    def took(data: bytes) -> bool:  # False once the body would pass max_bytes
        nonlocal first
        if first is None and data:
            first = clock()
        if len(body) + len(data) > max_bytes:
            body.extend(data[:max_bytes - len(body)])
            return False
        body.extend(data)
        return True

    if "chunked" in fields.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            digits = size_line.split(b";", 1)[0].strip()
            if not digits or len(digits) > 16 or not all(c in b"0123456789abcdefABCDEF"
                                                         for c in digits):
                raise ReplyError("bad chunk size")
            size = int(digits, 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return Reply(0, bytes(body), first, False), True
            while size:  # a chunk in pieces: a huge one is not held whole past max_bytes
                data = await reader.read(min(size, 65536))
                if not data:
                    raise ReplyError("chunk cut")
                size -= len(data)
                if not took(data):
                    return Reply(0, bytes(body), first, True), False
            await reader.readexactly(2)
    length = fields.get("content-length")
    if length is not None and length.isdigit():
        remaining = int(length)
        while remaining:
            data = await reader.read(min(remaining, 65536))
            if not data:
                raise ReplyError("body cut")
            remaining -= len(data)
            if not took(data):
                return Reply(0, bytes(body), first, True), False
        return Reply(0, bytes(body), first, False), True
    while data := await reader.read(65536):  # until the connection closes
        if not took(data):
            return Reply(0, bytes(body), first, True), False
    return Reply(0, bytes(body), first, False), False
