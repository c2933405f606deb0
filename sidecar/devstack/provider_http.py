"""The fake providers' HTTP/1.1 wire: reading a request, and writing replies framed as real
providers frame them (content-length, chunked, SSE), on time or late, whole or broken.

Separate from what a reply says (provider_wire.py) and from which behaviour a provider shows
(provider_behaviours.py), so each failure below is one function a behaviour names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


async def read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
    line = await reader.readline()
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


async def respond(writer: asyncio.StreamWriter, status: int, body: bytes,
                  content_type: str = "application/json", chunked: bool = False,
                  headers: Headers = ()) -> None:
    """A whole reply, with a content-length or (`chunked`) in chunks of up to 1 MiB."""
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


async def broken(writer: asyncio.StreamWriter, body: bytes, chunked: bool) -> None:
    """A 200 JSON reply that breaks after its headers and half of its body: chunked framing
    that turns invalid, or a content-length body cut off by a connection reset."""
    half = body[:len(body) // 2]
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(body)}"
    writer.write(_head(200, "application/json", framing)
                 + (_chunk(half) if chunked else half))
    await writer.drain()
    await asyncio.sleep(0.05)  # the headers and the first half are through before it breaks
    if chunked:
        writer.write(b"not-a-chunk-size\r\n" + body[len(half):] + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()
    else:
        writer.transport.abort()


@dataclass(frozen=True)
class Pacing:
    """When a stream's events go out, and how it ends if it does not end well."""

    delay_s: float = 0.0             # between events
    first_event_delay_s: float = 0.0  # after the headers, before the first event
    cut_after: int | None = None     # drop the connection after this many events
    stall_after: int | None = None   # send nothing more (connection open) after this many


async def stream(writer: asyncio.StreamWriter, events: Iterable[bytes],
                 pacing: Pacing = Pacing(), headers: Headers = ()) -> None:
    """An SSE reply: the headers at once, then each event as its own chunk."""
    writer.write(_head(200, "text/event-stream", "transfer-encoding: chunked",
                       (("cache-control", "no-cache"), *headers)))
    await writer.drain()
    if pacing.first_event_delay_s:
        await asyncio.sleep(pacing.first_event_delay_s)
    for sent, event in enumerate(events):
        if pacing.delay_s and sent:
            await asyncio.sleep(pacing.delay_s)
        if sent == pacing.cut_after:
            writer.transport.abort()
            return
        if sent == pacing.stall_after:
            await asyncio.sleep(3600)  # until the gateway gives up and closes
            return
        writer.write(_chunk(event))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
