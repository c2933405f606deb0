"""The fake providers over HTTP/2 (cleartext, prior knowledge: RFC 9113 §3.3), for providers
configured with `protocol: http2`. Needs the `h2` package (a dev dependency): only a peer
that opens with the HTTP/2 preface imports this module.

HTTP/2 has no chunked encoding: a reply "of undeclared length" is one without a
`content-length` header, its body in DATA frames ending with END_STREAM; a reply that
breaks mid-body is a RST_STREAM (RFC 9113 §6.4), which is what a provider behind an HTTP/2
load balancer sends when its backend dies. The same behaviours as over HTTP/1.1 apply
(providers.py decides the reply, this writes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from sidecar.devstack.provider_http import (
    ACCOUNT_HEADERS,
    H2_PREFACE_LINE,
    STEADY,
    Headers,
    Pacing,
    RecordedRequest,
    paced,
)

Handler = Callable[[RecordedRequest, "H2Wire"], Awaitable[bool]]


class H2Connection:
    """One HTTP/2 connection: requests are served concurrently, each on its stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 handle: Handler) -> None:
        self._reader = reader
        self._writer = writer
        self._handle = handle
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None))
        self._requests: dict[int, tuple[list[tuple[bytes, bytes]], bytearray]] = {}
        self._windows: dict[int, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, rest_of_preface: bytes) -> None:
        self.conn.initiate_connection()
        self._events(self.conn.receive_data(H2_PREFACE_LINE + rest_of_preface))
        await self.flush()
        while True:
            data = await self._reader.read(65536)
            if not data:
                break
            try:
                self._events(self.conn.receive_data(data))
            except h2.exceptions.ProtocolError:
                break
            await self.flush()
        for task in self._tasks:
            task.cancel()

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    def _events(self, events: list[h2.events.Event]) -> None:
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._requests[event.stream_id] = (list(event.headers), bytearray())
            elif isinstance(event, h2.events.DataReceived):
                self._requests[event.stream_id][1].extend(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._start(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                for waiting in self._windows.values():
                    waiting.set()
            elif isinstance(event, h2.events.StreamReset):
                self._requests.pop(event.stream_id, None)

    def _start(self, stream_id: int) -> None:
        raw, body = self._requests.pop(stream_id)
        headers = {k.decode().lower(): v.decode() for k, v in raw}
        request = RecordedRequest(headers.get(":method", ""), headers.get(":path", ""),
                                  {k: v for k, v in headers.items() if k[:1] != ":"},
                                  bytes(body), time.monotonic())
        task = asyncio.get_running_loop().create_task(self._answer(request, stream_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, request: RecordedRequest, stream_id: int) -> None:
        """A stream the peer reset, or a connection that went away, ends the answer."""
        with contextlib.suppress(h2.exceptions.StreamClosedError,
                                 h2.exceptions.ProtocolError, ConnectionError):
            await self._handle(request, H2Wire(self, stream_id))

    async def send(self, stream_id: int, data: bytes, end: bool) -> None:
        """DATA frames as the peer's flow-control window allows."""
        while data:
            window = min(self.conn.local_flow_control_window(stream_id),
                         self.conn.max_outbound_frame_size)
            if window <= 0:
                waiting = self._windows.setdefault(stream_id, asyncio.Event())
                waiting.clear()
                await waiting.wait()
                continue
            piece, data = data[:window], data[window:]
            self.conn.send_data(stream_id, piece, end_stream=end and not data)
            await self.flush()
        if end and not data:
            self._windows.pop(stream_id, None)


class H2Wire:
    """One reply on one HTTP/2 stream (the `Wire` of provider_http.py)."""

    def __init__(self, connection: H2Connection, stream_id: int) -> None:
        self._connection = connection
        self._id = stream_id
        self._reset = False

    def abort(self) -> None:
        """A broken stream: RST_STREAM, the connection stays (others may use it)."""
        self._reset = True
        self._connection.conn.reset_stream(self._id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        asyncio.get_running_loop().create_task(self._connection.flush())

    def _head(self, status: int, content_type: str, length: int | None,
              headers: Headers) -> None:
        fields = [(":status", str(status)), ("content-type", content_type),
                  *(() if length is None else (("content-length", str(length)),)),
                  *ACCOUNT_HEADERS, *headers]
        self._connection.conn.send_headers(self._id, fields)

    async def respond(self, status: int, body: bytes, content_type: str = "application/json",
                      chunked: bool = False, headers: Headers = ()) -> None:
        self._head(status, content_type, None if chunked else len(body), headers)
        await self._connection.flush()
        if body:
            await self._connection.send(self._id, body, end=True)
        else:
            self._connection.conn.end_stream(self._id)
            await self._connection.flush()

    async def broken(self, body: bytes, chunked: bool) -> None:
        self._head(200, "application/json", None if chunked else len(body), ())
        await self._connection.send(self._id, body[:len(body) // 2], end=False)
        await asyncio.sleep(0.05)
        self.abort()

    async def stream(self, events: Iterable[bytes], pacing: Pacing = STEADY,
                     headers: Headers = ()) -> None:
        self._head(200, "text/event-stream", None, (("cache-control", "no-cache"), *headers))
        await self._connection.flush()
        async for event in paced(events, pacing, self.abort):
            await self._connection.send(self._id, event, end=False)
        if pacing.end_delay_s:
            await asyncio.sleep(pacing.end_delay_s)
        if not self._reset:
            self._connection.conn.end_stream(self._id)
            await self._connection.flush()
