"""The ext_proc stream loop: one gRPC stream per HTTP request, two messages on the happy path
(request headers, then the buffered request body).

Two kinds of streams arrive on the same service. The router-level filter opens one per
request and gets the routing decision. The per-attempt filter on the target clusters opens
one only for a retry (Envoy skips it on first attempts) and names the attempt's cluster in
its attributes; that stream rewrites the retry for its target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from sidecar.dialects.errors import ClientError
from sidecar.extproc import messages
from sidecar.gateway import Gateway, Pending, Reply
from sidecar.gateway.runtime import TargetRoute

log = logging.getLogger("sidecar.extproc")


class ExternalProcessor(ext_grpc.ExternalProcessorServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        # Streams being served right now; an operator (and the leak tests) read it.
        self.active_streams = 0

    @property
    def max_body_bytes(self) -> int:
        return self._gateway.max_body_bytes

    async def Process(
        self,
        request_iterator: AsyncIterator[ext.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ext.ProcessingResponse]:
        self.active_streams += 1
        pending: Pending | None = None
        route: TargetRoute | None = None
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("request")
                if kind == "request_headers":
                    headers = messages.header_map(request.request_headers)
                    cluster = messages.attempt_cluster(request)
                    if cluster is not None:
                        attempt = self._gateway.on_attempt_headers(cluster, headers)
                        if isinstance(attempt, Reply):
                            yield messages.immediate(attempt)
                            return
                        route = attempt
                        yield messages.continue_attempt()
                        continue
                    outcome = self._gateway.on_headers(
                        headers, request.request_headers.end_of_stream
                    )
                    if isinstance(outcome, Reply):
                        yield messages.immediate(outcome)
                        return
                    pending = outcome
                    yield messages.continue_headers(headers)
                elif kind == "request_body" and route is not None:
                    rewritten = self._gateway.on_attempt_body(route, request.request_body.body)
                    if isinstance(rewritten, Reply):
                        yield messages.immediate(rewritten)
                    else:
                        yield messages.retarget(rewritten)
                    return
                elif kind == "request_body":
                    if pending is None:
                        yield messages.immediate(_internal("request body before headers"))
                        return
                    outcome = self._gateway.on_body(pending, request.request_body.body)
                    if isinstance(outcome, Reply):
                        yield messages.immediate(outcome)
                    else:
                        yield messages.forward(outcome)
                    return
                else:
                    # Phases we did not ask for (Envoy config drift): never stall the request.
                    log.warning("unexpected ext_proc message %s; continuing", kind)
                    return
        except asyncio.CancelledError:
            # Envoy resets finished or abandoned streams; both are normal.
            return
        except Exception:
            log.exception("ext_proc stream failed")
            anthropic = pending.dialect.is_anthropic if pending else False
            yield messages.immediate(_internal("internal routing error", anthropic))
        finally:
            self.active_streams -= 1


def _internal(message: str, anthropic: bool = False) -> Reply:
    error = ClientError(500, f"Sidecar error: {message}")
    return Reply(error.status, error.render(anthropic))
