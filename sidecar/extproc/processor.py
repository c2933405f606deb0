"""The ext_proc stream loop: one gRPC stream per HTTP request, two messages on the happy path
(request headers, then the buffered request body)."""

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

log = logging.getLogger("sidecar.extproc")


class ExternalProcessor(ext_grpc.ExternalProcessorServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    async def Process(
        self,
        request_iterator: AsyncIterator[ext.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ext.ProcessingResponse]:
        pending: Pending | None = None
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("request")
                if kind == "request_headers":
                    headers = messages.header_map(request.request_headers)
                    outcome = self._gateway.on_headers(
                        headers, request.request_headers.end_of_stream
                    )
                    if isinstance(outcome, Reply):
                        yield messages.immediate(outcome)
                        return
                    pending = outcome
                    yield messages.continue_headers(headers)
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


def _internal(message: str, anthropic: bool = False) -> Reply:
    error = ClientError(500, f"Sidecar error: {message}")
    return Reply(error.status, error.render(anthropic))
