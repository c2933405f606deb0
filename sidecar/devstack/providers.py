"""Demo providers: a small asyncio HTTP/1.1 server hosting named fake LLM providers.

Each provider lives under its own path prefix (``http://host:port/<name>/v1``) and speaks
OpenAI Chat and Anthropic Messages (JSON or SSE) and the OpenAI Responses API (JSON).
Knobs (latency, inter-event delay, forced status, connection reset, a stream that breaks
after N events, huge replies, broken framing, a body cut off mid-way, a 200 whose body is
not what the dialect promises) make it usable for failure tests; seeded random knobs (an
error rate, a latency spread, an output rate and a reply length per request) make it a
drifting provider for the routing-quality benchmark. Every request is recorded (method,
path, headers, JSON body, arrival time) so tests can assert what the upstream received.
The same code serves `sidecar up`, `sidecar demo-providers` and the test-suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.devstack import provider_wire

log = logging.getLogger("sidecar.demo")

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 529: "Overloaded"}


@dataclass
class Behaviour:
    """Knobs a test (or the demo CLI) can turn at any time."""

    latency_s: float = 0.0
    inter_event_delay_s: float = 0.0
    status: int | None = None
    reset_connection: bool = False
    text: str | None = None
    # Streams only: drop the connection after this many events (a mid-stream failure).
    fail_after_events: int | None = None
    # A huge but valid reply of about this many bytes: the text is made of 64 KiB words (one
    # SSE event each), so JSON replies carry it in the message and streams as many events;
    # the usage still comes last.
    body_bytes: int | None = None
    # JSON replies only, broken after their headers went out: chunked framing that turns
    # invalid after the first half of the body, or a content-length body cut off half-way by
    # a connection reset.
    invalid_chunked: bool = False
    reset_mid_body: bool = False
    # JSON replies framed with chunked encoding (no content-length), as many providers send
    # them from behind a CDN.
    chunked_json: bool = False
    # A 200 whose body is not what the dialect promises (an error object, HTML, garbage SSE):
    # sent as is, with this content type, instead of the completion.
    raw_body: bytes | None = None
    content_type: str = "application/json"
    # Answer a request that offers tools with a call to its first tool (text otherwise, and
    # after a tool's result came back), as JSON or as the dialect's tool-call stream deltas.
    call_tools: bool = False
    # A drifting provider (bench/routing_quality.py), drawn from the provider's seeded
    # random source: this share of requests fails with `error_status` (after the latency);
    # the latency is latency_s × a log-normal factor of this sigma; replies are
    # `reply_words(request)` words long and take words ÷ tokens_per_s to generate (unary
    # replies wait for it, streams space their events by it).
    error_rate: float = 0.0
    error_status: int = 503
    latency_spread: float = 0.0
    tokens_per_s: float | None = None
    reply_words: Callable[[dict[str, Any]], int] | None = None


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # time.monotonic() on arrival

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeProvider:
    name: str
    api_key: str | None = None
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: deque[RecordedRequest] = field(default_factory=lambda: deque(maxlen=10_000))
    cancelled: int = 0
    seed: int = 0
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.name}/{self.seed}")


class ProviderServer:
    """One listening socket, many named providers."""

    def __init__(self, providers: list[FakeProvider], host: str = "127.0.0.1", port: int = 0):
        self.providers = {p.name: p for p in providers}
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        self._ids = itertools.count(1)
        self._open: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}

    def base_url(self, name: str, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}/{name}/v1"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            tasks = list(self._open.values())
            for writer in list(self._open):
                writer.transport.abort()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        assert task is not None
        self._open[writer] = task
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                keep_alive = await self._serve(request, writer)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass
        finally:
            self._open.pop(writer, None)
            writer.close()

    async def _serve(self, request: RecordedRequest, writer: asyncio.StreamWriter) -> bool:
        name, _, rest = request.path.lstrip("/").partition("/")
        provider = self.providers.get(name)
        if provider is None:
            await _respond(writer, 404,
                           provider_wire.openai_error(404, f"no demo provider '{name}'"))
            return True
        provider.received.append(request)
        endpoint = "/" + rest.split("?", 1)[0]
        anthropic = endpoint == "/v1/messages"
        if endpoint not in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            await _respond(writer, 404,
                           provider_wire.openai_error(404, f"unknown endpoint {endpoint}"))
            return True
        error = provider_wire.anthropic_error if anthropic else provider_wire.openai_error
        behaviour = provider.behaviour
        latency = behaviour.latency_s
        if latency and behaviour.latency_spread:
            latency *= provider.rng.lognormvariate(0.0, behaviour.latency_spread)
        if latency:
            await asyncio.sleep(latency)
        if behaviour.reset_connection:
            writer.transport.abort()
            return False
        if provider.api_key is not None and _credential(request, anthropic) != provider.api_key:
            await _respond(writer, 401, error(401, "invalid provider API key"))
            return True
        status = behaviour.status
        if behaviour.error_rate and provider.rng.random() < behaviour.error_rate:
            status = behaviour.error_status
        if status is not None and status != 200:
            await _respond(writer, status, error(status, "injected failure"))
            return True
        if behaviour.raw_body is not None:
            await _respond(writer, 200, behaviour.raw_body, behaviour.content_type)
            return True
        try:
            payload = request.json()
        except ValueError:
            await _respond(writer, 400, error(400, "body is not JSON"))
            return True
        text = behaviour.text
        if behaviour.reply_words is not None:
            text = " ".join(["word"] * max(1, behaviour.reply_words(payload)))
        if behaviour.body_bytes:
            text = " ".join(["x" * _BIG_WORD] * max(1, behaviour.body_bytes // (_BIG_WORD + 1)))
        completion = provider_wire.make_completion(
            f"{'msg' if anthropic else 'chatcmpl'}_demo_{next(self._ids)}",
            provider.name, payload, len(request.body), text, behaviour.call_tools,
        )
        if endpoint == "/v1/responses":
            if payload.get("stream") is True:
                await _respond(writer, 400, error(400, "demo Responses API is unary only"))
            else:
                await _respond(writer, 200, provider_wire.responses_json(completion))
            return True
        rate = behaviour.tokens_per_s
        if payload.get("stream") is not True:
            if rate:
                await asyncio.sleep(completion.completion_tokens / rate)
            body = (provider_wire.anthropic_json(completion) if anthropic
                    else provider_wire.openai_json(completion))
            if behaviour.invalid_chunked or behaviour.reset_mid_body:
                await _broken(writer, body, chunked=behaviour.invalid_chunked)
                return False
            await _respond(writer, 200, body, chunked=behaviour.chunked_json)
            return True
        if anthropic:
            events = provider_wire.anthropic_events(completion)
        else:
            include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            events = provider_wire.openai_events(completion, include_usage)
        try:
            await _stream(writer, events, 1 / rate if rate else behaviour.inter_event_delay_s,
                          behaviour.fail_after_events)
        except ConnectionError:
            provider.cancelled += 1
            return False
        return True


# Real providers name the account behind the key, its rate limits and a CDN cookie in
# response headers; so do the fakes, so tests can show the gateway passes on only its
# allowlist (the request id among it).
_ACCOUNT_HEADER = ("openai-organization: org-demo-account\r\n"
                   "x-ratelimit-remaining-requests: 99\r\n"
                   "set-cookie: cdn=provider-cookie\r\n"
                   "request-id: req-demo-1")


def _credential(request: RecordedRequest, anthropic: bool) -> str | None:
    """Anthropic accepts `x-api-key` (and, like OpenAI, a bearer token); OpenAI only bearer."""
    if anthropic and "x-api-key" in request.headers:
        return request.headers["x-api-key"]
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
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


_BIG_WORD = 64 * 1024 - 1
_WRITE_PIECE = 1024 * 1024


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes,
                   content_type: str = "application/json", chunked: bool = False) -> None:
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {len(body)}"
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
            f"content-type: {content_type}\r\n{framing}\r\n{_ACCOUNT_HEADER}\r\n\r\n")
    if not chunked and len(body) <= _WRITE_PIECE:
        writer.write(head.encode() + body)
        await writer.drain()
        return
    writer.write(head.encode())
    for start in range(0, len(body), _WRITE_PIECE):  # a huge body goes out as it drains
        piece = body[start:start + _WRITE_PIECE]
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
        await writer.drain()
    if chunked:
        writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _broken(writer: asyncio.StreamWriter, body: bytes, chunked: bool) -> None:
    """A 200 JSON reply that breaks after its headers and half of its body."""
    half = body[:len(body) // 2]
    framing = (b"transfer-encoding: chunked\r\n\r\n" + f"{len(half):x}\r\n".encode() + half
               + b"\r\n") if chunked else f"content-length: {len(body)}\r\n\r\n".encode() + half
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + framing)
    await writer.drain()
    await asyncio.sleep(0.05)  # the headers and the first half are through before it breaks
    if chunked:
        writer.write(b"not-a-chunk-size\r\n" + body[len(half):] + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()
    else:
        writer.transport.abort()


async def _stream(writer: asyncio.StreamWriter, events: Any, delay: float,
                  fail_after: int | None = None) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n"
                 + _ACCOUNT_HEADER.encode() + b"\r\n\r\n")
    for sent, event in enumerate(events):
        if delay and sent:
            await asyncio.sleep(delay)
        if sent == fail_after:
            writer.transport.abort()
            return
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
