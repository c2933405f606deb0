"""A routing service for `strategy: external`, speaking both variants of the API: the
ExternalRouter gRPC service (served with the generated stubs) and the HTTP JSON form.

What it answers is programmable (`RoutingBehaviour`), so the tests can make it answer,
stall, fail or name targets outside the group; every request it receives is kept, so a test
can check what the sidecar sent. It is also the smallest working example of such a service
for an operator (docs/external.md)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import grpc
from google.protobuf import json_format

from sidecar.devstack.provider_http import read_request, respond
from sidecar.external.v1 import router_pb2_grpc
from sidecar.external.v1.router_pb2 import RankRequest, RankResponse


@dataclass
class RoutingBehaviour:
    """`answer(request)` gives the target labels; `delay_s` stalls first; `fail` answers
    with an error (gRPC INTERNAL, HTTP 500) instead; `raw_http` is a 200 body the HTTP
    variant sends as it is (a hostile service's answer)."""

    answer: Callable[[RankRequest], list[str]] = field(
        default=lambda request: [c.label for c in reversed(request.candidates)])
    delay_s: float = 0.0
    fail: bool = False
    raw_http: bytes | None = None


class RoutingService:
    """Both variants on their own event loop in a daemon thread, on loopback ports."""

    def __init__(self) -> None:
        self.behaviour = RoutingBehaviour()
        self.received: list[RankRequest] = []
        self.received_json: list[bytes] = []
        self.grpc_port = 0
        self.http_port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._grpc: grpc.aio.Server | None = None
        self._http: asyncio.Server | None = None

    @property
    def grpc_url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/rank"

    def __enter__(self) -> RoutingService:
        self._thread.start()
        self._run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self, coroutine) -> object:
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(10)

    async def _start(self) -> None:
        self._grpc = grpc.aio.server()
        router_pb2_grpc.add_ExternalRouterServicer_to_server(_Servicer(self), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        await self._grpc.start()
        self._http = await asyncio.start_server(self._serve_http, "127.0.0.1", 0)
        self.http_port = self._http.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(0)
        if self._http is not None:
            self._http.close()

    async def rank(self, request: RankRequest) -> RankResponse | None:
        """The behaviour's answer, or None for a failure."""
        self.received.append(request)
        behaviour = self.behaviour
        if behaviour.delay_s:
            await asyncio.sleep(behaviour.delay_s)
        if behaviour.fail:
            return None
        return RankResponse(targets=behaviour.answer(request))

    async def _serve_http(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                self.received_json.append(request.body)
                parsed = json_format.Parse(request.body, RankRequest())
                answer = await self.rank(parsed)
                if self.behaviour.raw_http is not None:
                    await respond(writer, 200, self.behaviour.raw_http)
                elif answer is None:
                    await respond(writer, 500, json.dumps({"error": "failing"}).encode())
                else:
                    await respond(writer, 200, json_format.MessageToJson(answer).encode())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


class _Servicer(router_pb2_grpc.ExternalRouterServicer):
    def __init__(self, service: RoutingService) -> None:
        self._service = service

    async def Rank(self, request: RankRequest,
                   context: grpc.aio.ServicerContext) -> RankResponse:
        answer = await self._service.rank(request)
        if answer is None:
            await context.abort(grpc.StatusCode.INTERNAL, "failing")
        return answer
