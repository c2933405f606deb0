"""The fake providers' HTTP/1.1 wire: reading a request, and writing replies framed as real
providers frame them (content-length, chunked, SSE), on time or late, whole or broken.

Separate from what a reply says (provider_wire.py) and from which behaviour a provider shows
(provider_behaviours.py), so each failure below is one function a behaviour names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 413: "Payload Too Large", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           529: "Overloaded"}

# Real providers name the account behind the key, its rate limits and a CDN cookie in
# response headers; so do the fakes, so tests can show the gateway passes on only its
# allowlist (the request id among it).
ACCOUNT_HEADERS = (("openai-organization", "org-demo-account"),
                   ("x-ratelimit-remaining-requests", "99"),
                   ("set-cookie", "cdn=provider-cookie"),
                   ("request-id", "req-demo-1"))

Headers = Iterable[tuple[str, str]]

_WRITE_PIECE = 1024 * 1024
# The first line of an HTTP/2 client's connection preface (RFC 9113 §3.4).
H2_PREFACE_LINE = b"PRI * HTTP/2.0\r\n"


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.monotonic() on arrival

    def json(self) -> Any:
        import json
        return json.loads(self.body)


async def read_request(reader: asyncio.StreamReader,
                       line: bytes | None = None) -> RecordedRequest | None:
    """The next request on an HTTP/1.1 connection (`line`: its request line, if already
    read)."""
    line = line if line is not None else await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        key, _, value = raw.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RecordedRequest(method, path, headers, body, time.monotonic())


def _head(status: int, content_type: str, framing: str, extra: Headers = ()) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
             f"content-type: {content_type}", framing,
             *(f"{name}: {value}" for name, value in (*ACCOUNT_HEADERS, *extra))]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunk(piece: bytes) -> bytes:
    return f"{len(piece):x}\r\n".encode() + piece + b"\r\n"


@dataclass(frozen=True)
class Pacing:
    """When a stream's events go out, and how it ends if it does not end well."""

    delay_s: float = 0.0             # between events
    first_event_delay_s: float = 0.0  # after the headers, before the first event
    cut_after: int | None = None     # drop the connection after this many events
    stall_after: int | None = None   # send nothing more (connection open) after this many
    end_delay_s: float = 0.0         # after the last event, before the stream's end


STEADY = Pacing()  # events back to back, none cut or stalled


class Wire(Protocol):
    """Where a fake provider writes one reply: HTTP/1.1 (`Http1Wire`) or an HTTP/2 stream
    (provider_h2.py). `chunked` means "no declared length" in either."""

    def abort(self) -> None: ...

    async def respond(self, status: int, body: bytes, content_type: str = "application/json",
                      chunked: bool = False, headers: Headers = ()) -> None: ...

    async def broken(self, body: bytes, chunked: bool) -> None: ...

    async def stream(self, events: Iterable[bytes], pacing: Pacing = ...,
                     headers: Headers = ()) -> None: ...


class Http1Wire:
    """Replies on one HTTP/1.1 connection (what `_serve` of providers.py writes to; the
    HTTP/2 wire, provider_h2.py, has the same methods)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def abort(self) -> None:
        """Drop the connection (a reset, as a crashed provider or a load balancer does)."""
        self._writer.transport.abort()

    async def respond(self, status: int, body: bytes, content_type: str = "application/json",
                      chunked: bool = False, headers: Headers = ()) -> None:
        """A whole reply, with a content-length or (`chunked`) in chunks of up to 1 MiB."""
        writer = self._writer
        framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(body)}"
        head = _head(status, content_type, framing, headers)
        if not chunked and len(body) <= _WRITE_PIECE:
            writer.write(head + body)
            await writer.drain()
            return
        writer.write(head)
        for start in range(0, len(body), _WRITE_PIECE):  # a huge body goes out as it drains
            piece = body[start:start + _WRITE_PIECE]
            writer.write(_chunk(piece) if chunked else piece)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def broken(self, body: bytes, chunked: bool) -> None:
        """A 200 JSON reply that breaks after its headers and half of its body: chunked
        framing that turns invalid, or a content-length body cut off by a connection
        reset."""
        writer = self._writer
        half = body[:len(body) // 2]
        framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(body)}"
        writer.write(_head(200, "application/json", framing)
                     + (_chunk(half) if chunked else half))
        await writer.drain()
        await asyncio.sleep(0.05)  # the headers and the first half are through first
        if chunked:
            writer.write(b"not-a-chunk-size\r\n" + body[len(half):] + b"\r\n0\r\n\r\n")
            await writer.drain()
            writer.close()
        else:
            writer.transport.abort()

    async def stream(self, events: Iterable[bytes], pacing: Pacing = STEADY,
                     headers: Headers = ()) -> None:
        """An SSE reply: the headers at once, then each event as its own chunk."""
        writer = self._writer
        writer.write(_head(200, "text/event-stream", "transfer-encoding: chunked",
                           (("cache-control", "no-cache"), *headers)))
        await writer.drain()
        async for event in paced(events, pacing, self.abort):
            writer.write(_chunk(event))
            await writer.drain()
        if pacing.end_delay_s:
            await asyncio.sleep(pacing.end_delay_s)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def respond(writer: asyncio.StreamWriter, status: int, body: bytes,
                  content_type: str = "application/json", chunked: bool = False,
                  headers: Headers = ()) -> None:
    """`Http1Wire.respond` for code that holds a bare writer (the demo routing service)."""
    await Http1Wire(writer).respond(status, body, content_type, chunked, headers)


async def paced(events: Iterable[bytes], pacing: Pacing,
                abort: Callable[[], None]) -> AsyncIterator[bytes]:
    """The events at `pacing`'s times; a cut drops the connection (`abort`) and ends the
    stream, a stall waits until the gateway gives up."""
    if pacing.first_event_delay_s:
        await asyncio.sleep(pacing.first_event_delay_s)
    for sent, event in enumerate(events):
        if pacing.delay_s and sent:
            await asyncio.sleep(pacing.delay_s)
        if sent == pacing.cut_after:
            abort()
            return
        if sent == pacing.stall_after:
            await asyncio.sleep(3600)
            return
        yield event
