"""One routed request through the sidecar in process, as Envoy would send it: the request
headers and body as upb messages serialized to bytes, parsed back per request, and the
answers serialized as on the wire — what routing_overhead.py, large_config.py and
shadow_cost.py time."""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from sidecar.extproc.messages import BodyAnswer
from sidecar.extproc.processor import ExternalProcessor


def chat_wire(body: bytes, token: str, path: str = "/v1/chat/completions") -> tuple[bytes, bytes]:
    """The two ext_proc messages of a chat request: headers, then the whole body."""
    headers = ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=HeaderMap(headers=[
        HeaderValue(key=k, raw_value=v.encode()) for k, v in {
            ":path": path, ":method": "POST", ":authority": "bench",
            "authorization": f"Bearer {token}", "content-type": "application/json",
            "content-length": str(len(body)), "user-agent": "bench"}.items()])))
    message = ext.ProcessingRequest(request_body=ext.HttpBody(body=body, end_of_stream=True))
    return headers.SerializeToString(), message.SerializeToString()


def one_request(processor: ExternalProcessor, messages: tuple[bytes, ...]) -> None:
    """Parse each message from bytes, handle it, and serialize the answer (body answers
    are framed from their pieces)."""
    stream = processor.stream()
    for raw in messages:
        response, done = stream.step(ext.ProcessingRequest.FromString(raw))
        if isinstance(response, BodyAnswer):
            response.wire_parts()
        elif response is not None:
            response.SerializeToString()
        if done:
            break
