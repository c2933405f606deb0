"""The ext_proc protocol loop: one gRPC stream per HTTP request, two messages on the happy path
(request headers, then the buffered request body).

Several kinds of streams arrive on the same service. The router-level filter opens one per
request and gets the routing decision. The per-attempt filter on the target clusters opens
one only for a retry (Envoy skips it on first attempts) and names the attempt's cluster in
its attributes; that stream rewrites the retry for its target. A bridge cluster's filter
opens one per attempt (request and response). The reply gate's filters open one for a reply
Envoy holds before its router sees it, and start with the response headers
(gateway/reply_gate.py).

Everything here is synchronous — a message in, at most one response out, and whether the
stream is done; the gRPC server (sidecar.grpcwire) calls it straight from the socket read —
except for a decision that waits in a task while the loop serves everyone else
(`ProcessStream._defer`): a `strategy: external` group's, on its routing service
(docs/external.md), and a request whose quota lease is empty on this replica while its
caller is under the limit, on the next quota round (docs/quotas.md §3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter

from envoy.config.core.v3.base_pb2 import Metadata
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf.message import DecodeError

from sidecar.dialects.errors import ClientError
from sidecar.extproc import messages
from sidecar.gateway import Gateway, Pending, Reply, bridging
from sidecar.gateway.bridging import BridgeAttempt
from sidecar.gateway.outcome import Ask, Deferred, Forward, LeaseWait
from sidecar.gateway.reply_gate import (
    FirstEventGate,
    Retry,
    UndeclaredLengthGate,
    is_event_stream,
)
from sidecar.gateway.runtime import TargetRoute
from sidecar.grpcwire.call import Call, UndecodableMessage
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.telemetry.timing import HandlingTimes

log = logging.getLogger("sidecar.extproc")
# Whatever the calls, at most 10 lines of each kind a minute (grpcwire/ratelimit.py).
_limited = LogLimiter(log, burst=10, interval=60.0)

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD = "Process"

# (answer to send, stream done)
# (a Deferred outcome: the answer comes later, from a task; see ProcessStream._defer)
Step = tuple[ext.ProcessingResponse | messages.BodyAnswer | Deferred | None, bool]


class ExternalProcessor:
    """Makes one `ProcessStream` per ext_proc stream and counts the open ones (an operator,
    and the leak tests, read `active_streams` from the admin /status endpoint)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.active_streams = 0
        self.handling = HandlingTimes()  # per message, for /metrics

    @property
    def max_body_bytes(self) -> int:
        return self.gateway.max_body_bytes

    @property
    def retry_credentials_received(self) -> int:
        return self.gateway.retry_credentials_received

    def stream(self) -> ProcessStream:
        self.active_streams += 1
        return ProcessStream(self)

    def _closed(self) -> None:
        self.active_streams -= 1


class ProcessStream:
    """One ext_proc stream: the gRPC handler interface around `step`."""

    __slots__ = ("_bridge", "_closed", "_gate", "_gateway", "_overdue", "_pending",
                 "_processor", "_route", "_task")

    def __init__(self, processor: ExternalProcessor) -> None:
        self._processor = processor
        self._gateway = processor.gateway
        self._pending: Pending | None = None
        self._route: TargetRoute | None = None
        self._bridge: BridgeAttempt | None = None
        self._gate: UndeclaredLengthGate | FirstEventGate | None = None
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        # A held stream's first-event deadline (gateway/first_event_deadline.py).
        self._overdue: asyncio.TimerHandle | None = None

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        started = perf_counter()
        try:
            request = ext.ProcessingRequest.FromString(payload)
        except DecodeError as error:  # the peer's fault: INVALID_ARGUMENT, no traceback
            raise UndecodableMessage(str(error)) from None
        response, done = self.step(request)
        if isinstance(response, Ask | LeaseWait):
            self._defer(call, response)
        else:
            _send(call, response)
        self._processor.handling.observe(perf_counter() - started)
        if done:
            call.finish()
            self._close()
        elif self._overdue is None and isinstance(self._gate, FirstEventGate):
            deadline = self._gate.deadline_s
            if deadline:
                self._overdue = asyncio.get_running_loop().call_later(
                    deadline, self._first_event_overdue, call)

    def _first_event_overdue(self, call: Call) -> None:
        """The primary's stream has not sent its first event by its deadline: the held
        reply becomes a retriable failure, and the router moves the request on."""
        self._overdue = None
        gate = self._gate
        if self._closed or not isinstance(gate, FirstEventGate):
            return
        verdict = gate.overdue()
        _send(call, messages.retry_held_reply(verdict.status, verdict.attempt_order))
        call.finish()
        self._close()

    def _defer(self, call: Call, outcome: Deferred) -> None:
        """The asynchronous seam: the decision waits in a task while the loop serves every
        other stream. What it waits on bounds the wait (the routing service's deadline,
        external/client.py; `quotas.lease_wait_ms`, quotas/admission.py)."""
        call.defer()
        self._task = asyncio.get_running_loop().create_task(self._answer(call, outcome))

    async def _answer(self, call: Call, deferred: Deferred) -> None:
        """Whatever happens, the call is answered and finished (a failure as the caller's
        500), unless Envoy ended it first. A request that waited for its quota lease may
        then wait on its external group's routing service."""
        outcome: Deferred | Reply | Forward = deferred
        try:
            while isinstance(outcome, Ask | LeaseWait):
                answer = await outcome.fetch()
                if self._closed:
                    return
                started = perf_counter()
                outcome = outcome.resume(answer)  # type: ignore[arg-type]
                self._processor.handling.observe(perf_counter() - started)
            response = (messages.immediate(outcome) if isinstance(outcome, Reply)
                        else messages.forward(outcome))
        except Exception:
            _limited.exception("stream_failed", "ext_proc stream failed")
            anthropic = self._pending.dialect.is_anthropic if self._pending else False
            response = messages.immediate(_internal("internal routing error", anthropic))
        _send(call, response)
        call.finish()
        self._close()

    def on_half_close(self, call: Call) -> None:
        call.finish()
        self._close()

    def on_cancel(self) -> None:
        # Envoy resets finished or abandoned streams; both are normal.
        if self._task is not None:
            self._task.cancel()
        self._close()

    def _close(self) -> None:
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None
        if not self._closed:
            self._closed = True
            self._processor._closed()

    def step(self, request: ext.ProcessingRequest) -> Step:
        try:
            return self._step(request)
        except Exception:
            _limited.exception("stream_failed", "ext_proc stream failed")
            anthropic = self._pending.dialect.is_anthropic if self._pending else False
            return messages.immediate(_internal("internal routing error", anthropic)), True

    def _step(self, request: ext.ProcessingRequest) -> Step:
        kind = request.WhichOneof("request")
        gateway = self._gateway
        if kind == "request_headers":
            headers = messages.header_map(request.request_headers)
            cluster = messages.attempt_cluster(request)
            if cluster is not None:
                self._bridge = gateway.bridge_attempt(cluster, headers)
                if self._bridge is not None:
                    return messages.continue_attempt(), False
                attempt = gateway.on_attempt_headers(cluster, headers)
                if isinstance(attempt, Reply):
                    return messages.immediate(attempt), True
                self._route = attempt
                return messages.continue_attempt(), False
            outcome = gateway.on_headers(headers, request.request_headers.end_of_stream)
            if isinstance(outcome, Reply):
                return messages.immediate(outcome), True
            self._pending = outcome
            return messages.continue_headers(headers, gateway.forwarded_headers), False
        if self._bridge is not None:
            return self._bridged(kind, request)
        if kind == "response_headers" and self._pending is None and self._route is None:
            return self._gate_opened(request.response_headers, request.metadata_context)
        if kind == "response_body" and self._gate is not None:
            return self._gated(request.response_body)
        if kind == "request_body" and self._route is not None:
            rewritten = gateway.on_attempt_body(self._route, request.request_body.body)
            if isinstance(rewritten, Reply):
                return messages.immediate(rewritten), True
            return messages.retarget(rewritten), True
        if kind == "request_body":
            if self._pending is None:
                return messages.immediate(_internal("request body before headers")), True
            outcome = gateway.on_body(self._pending, request.request_body.body)
            if isinstance(outcome, Reply):
                return messages.immediate(outcome), True
            if isinstance(outcome, Ask | LeaseWait):
                return outcome, False
            return messages.forward(outcome), True
        # Phases we did not ask for (Envoy config drift): never stall the request.
        _limited.warning("unexpected_message", "unexpected ext_proc message %s; continuing",
                         kind)
        return None, True


    def _gate_opened(self, message: ext.HttpHeaders, metadata: Metadata) -> Step:
        """A reply held at the gate: read a body of undeclared length whole; hold a
        stream's headers unanswered until its first event."""
        if message.end_of_stream:
            return messages.continue_response_headers(), True
        headers = messages.header_map(message)
        order = messages.order_of(metadata)
        if is_event_stream(headers):
            self._gate = FirstEventGate(headers, order)
            return None, False
        self._gate = UndeclaredLengthGate(headers, order)
        return messages.continue_response_headers(), False

    def _gated(self, body: ext.HttpBody) -> Step:
        gate = self._gate
        if isinstance(gate, UndeclaredLengthGate):
            release = gate.body(body.body, body.end_of_stream, time.time())
            return messages.release_body(release.facts, release.set_headers,
                                         release.attempt_order), True
        verdict = gate.body(body.body, body.end_of_stream)  # type: ignore[union-attr]
        if verdict is None:
            return None, False
        if isinstance(verdict, Retry):
            return messages.retry_held_reply(verdict.status, verdict.attempt_order), True
        # Ending the stream is "processing complete" for Envoy: the held headers and chunks
        # go on, and the rest of the stream flows without the sidecar.
        return None, True

    def _bridged(self, kind: str | None, request: ext.ProcessingRequest) -> Step:
        """The phases of an attempt through a bridge cluster (gateway/bridging.py)."""
        attempt = self._bridge
        assert attempt is not None
        anthropic = attempt.bridge.translator.caller.is_anthropic
        if kind == "request_body":
            rewrite = bridging.request_rewrite(attempt, request.request_body.body,
                                               self._gateway.sessions)
            if isinstance(rewrite, ClientError):
                return messages.immediate(Reply(rewrite.status, rewrite.render(anthropic))), True
            return messages.bridge_request(rewrite), False
        if kind == "response_headers":
            headers = messages.header_map(request.response_headers)
            rewrite = bridging.response_headers(attempt, headers)
            if request.response_headers.end_of_stream:
                # No body will follow (an empty answer): translate it now, or the caller
                # would get an empty 200 in the wrong dialect.
                answer = bridging.response_body(attempt, b"", time.time, self._gateway.sessions,
                                                self._gateway.store_answer)
                return messages.bridge_empty_answer(rewrite, answer), True
            return messages.bridge_response_headers(rewrite), False
        if kind == "response_body":
            return messages.bridge_response_body(bridging.response_body(
                attempt, request.response_body.body, time.time, self._gateway.sessions,
                self._gateway.store_answer)), True
        _limited.warning("unexpected_message", "unexpected ext_proc message %s on a bridge; "
                         "continuing", kind)
        return None, True


def _send(call: Call, response: ext.ProcessingResponse | messages.BodyAnswer | None) -> None:
    if isinstance(response, messages.BodyAnswer):
        call.send_parts(response.wire_parts())
    elif response is not None:
        call.send(response.SerializeToString())


def _internal(message: str, anthropic: bool = False) -> Reply:
    error = ClientError(500, f"Sidecar error: {message}")
    return Reply(error.status, error.render(anthropic))
