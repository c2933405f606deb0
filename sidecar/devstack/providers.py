"""Demo providers: a small asyncio HTTP/1.1 server hosting named fake LLM providers.

Each provider lives under its own path prefix (``http://host:port/<name>/v1``) and speaks
OpenAI Chat and Anthropic Messages (JSON or SSE) and the OpenAI Responses API (JSON).
Knobs (latency, inter-event delay, forced or transient status with the provider's headers,
connection reset, a stream that breaks, stalls, starts late or errors in-band, huge replies,
chunked or broken framing, a body cut off mid-way, a 200 whose body is not what the dialect
promises, a context window, prompt-cache usage) make it usable for failure tests (named
combinations after real providers' documentation: provider_behaviours.py); seeded random knobs (an
error rate, a latency spread, an output rate and a reply length per request) make it a
drifting provider for the routing-quality benchmark. Every request is recorded (method,
path, headers, JSON body, arrival time) so tests can assert what the upstream received.
The same code serves `sidecar up`, `sidecar demo-providers` and the test-suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sidecar.devstack import provider_wire
from sidecar.devstack.provider_http import (
    H2_PREFACE_LINE,
    Http1Wire,
    Pacing,
    RecordedRequest,
    Wire,
    read_request,
)

log = logging.getLogger("sidecar.demo")

@dataclass
class Behaviour:
    """Knobs a test (or the demo CLI) can turn at any time. Named combinations that follow a
    real provider's documented behaviour are in provider_behaviours.py."""

    latency_s: float = 0.0
    inter_event_delay_s: float = 0.0
    status: int | None = None
    # The body of a `status` reply (default: a generic error in the endpoint's dialect).
    error_body: bytes | None = None
    # Response headers on every reply, e.g. `retry-after` or a provider's rate-limit resets.
    headers: tuple[tuple[str, str], ...] = ()
    # Only the first this many requests fail with `status` (0: all of them), then the
    # provider recovers: a transient failure.
    fail_first: int = 0
    reset_connection: bool = False
    text: str | None = None
    # Streams only: drop the connection after this many events (a mid-stream failure); stop
    # sending, with the connection open, after this many (a stall); send the headers at once
    # and the first event only after a delay (a slow first token); replace the stream with
    # this one event after a 200 (an in-band error), or put a garbage event after this many.
    fail_after_events: int | None = None
    stall_after_events: int | None = None
    first_event_delay_s: float = 0.0
    first_event: bytes | None = None
    garbage_after_events: int | None = None
    # Streams only: the end of the stream (the last chunk, or HTTP/2's END_STREAM) this
    # long after the last event. platform.openai.com/docs/api-reference/chat-streaming ends
    # a stream's events with `data: [DONE]`; RFC 9112 §7.1 makes the zero-size last chunk
    # a separate piece of the framing (RFC 9113 §8.1: END_STREAM may come on a later,
    # empty DATA frame), so on the internet the two can arrive apart.
    stream_end_delay_s: float = 0.0
    # Refuse a request whose prompt tokens plus its output cap exceed this, with the
    # dialect's context-length error (`vllm_errors`: in vLLM's shape).
    context_window_tokens: int | None = None
    vllm_errors: bool = False
    # ...or in the shape of this provider family of the refusal catalogue (its status and
    # body as observe/refusal_catalogue.py has them: "llama.cpp", "gemini", "tgi", …).
    refuses_as: str | None = None
    # Prompt-cache tokens reported in the usage: (read, written).
    cache_tokens: tuple[int, int] = (0, 0)
    # False: report no usage at all (OpenAI dialect), in JSON or streams, whatever
    # `stream_options` asks, as some OpenAI-compatible servers do.
    reports_usage: bool = True
    # OpenAI streams only: JSON with Python's default separators (`"choices": []`), and
    # llama.cpp's `timings` object on the stream's last chunk (provider_wire.openai_events).
    spaced_json: bool = False
    engine_timings: bool = False
    # A huge but valid reply of about this many bytes: the text is made of 64 KiB words (one
    # SSE event each), so JSON replies carry it in the message and streams as many events;
    # the usage still comes last.
    body_bytes: int | None = None
    # JSON replies only, broken after their headers went out: chunked framing that turns
    # invalid after the first half of the body, or a content-length body cut off half-way by
    # a connection reset.
    invalid_chunked: bool = False
    reset_mid_body: bool = False
    # JSON replies (errors too) framed with chunked encoding (no content-length), as many
    # providers send them from behind a CDN.
    chunked_json: bool = False
    # A 200 whose body is not what the dialect promises (an error object, HTML, garbage SSE):
    # sent as is, with this content type, instead of the completion.
    raw_body: bytes | None = None
    content_type: str = "application/json"
    # Answer a request that offers tools with a call to its first tool (text otherwise, and
    # after a tool's result came back), as JSON or as the dialect's tool-call stream deltas.
    call_tools: bool = False
    # With `call_tools`: a call longer than the request's cap is cut there, as an engine
    # cuts it (provider_wire.make_completion): `finish_reason: "length"`, arguments cut.
    cut_tool_calls: bool = False
    # A drifting provider (bench/routing_quality.py), drawn from the provider's seeded
    # random source: this share of requests fails with `error_status` (after the latency);
    # the latency is latency_s × a log-normal factor of this sigma; replies are
    # `reply_words(request)` words long and take words ÷ tokens_per_s to generate (unary
    # replies wait for it, streams space their events by it).
    error_rate: float = 0.0
    error_status: int = 503
    # Headers on those injected failures only: a 429's `retry-after` (RFC 9110 §10.2.3;
    # platform.openai.com/docs/guides/rate-limits and docs.anthropic.com/en/api/rate-limits
    # send it with the 429, not with every answer).
    error_headers: tuple[tuple[str, str], ...] = ()
    # How long an injected failure takes to come (None: the reply's latency, as before). A
    # provider's 429 comes at once, a 503 before any generation: the routing benchmark's
    # simulator answers them so (bench/family_sim.py), and so the stack's run must.
    error_latency_s: float | None = None
    latency_spread: float = 0.0
    tokens_per_s: float | None = None
    reply_words: Callable[[dict[str, Any]], int] | None = None
    # A slow-start tail (bench/hedging.py): this share of requests, drawn from the seeded
    # source, waits `slow_start_s` more before anything is sent, as a provider does when a
    # request queues behind others or lands on a cold replica. Timing only: the reply's
    # framing, headers and usage are the endpoint's usual ones (no API document defines
    # when a provider starts to answer).
    slow_start_share: float = 0.0
    slow_start_s: float = 0.0


@dataclass
class FakeProvider:
    name: str
    api_key: str | None = None
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: deque[RecordedRequest] = field(default_factory=lambda: deque(maxlen=10_000))
    cancelled: int = 0
    served: int = 0  # requests answered so far (`Behaviour.fail_first` counts them)
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
            first = await reader.readline()
            if first == H2_PREFACE_LINE:  # HTTP/2 with prior knowledge (provider_h2.py)
                from sidecar.devstack.provider_h2 import H2Connection  # needs `h2`

                await H2Connection(reader, writer, self._serve).serve(
                    await reader.readexactly(8))
                return
            request = await read_request(reader, first)
            while request is not None:
                keep_alive = await self._serve(request, Http1Wire(writer))
                if not keep_alive:
                    break
                request = await read_request(reader)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass
        finally:
            self._open.pop(writer, None)
            writer.close()

    async def _serve(self, request: RecordedRequest, wire: Wire) -> bool:
        """Answer one request on `wire` (HTTP/1.1 or HTTP/2); False: the connection was
        dropped."""
        name, _, rest = request.path.lstrip("/").partition("/")
        provider = self.providers.get(name)
        if provider is None:
            await wire.respond(404,
                          provider_wire.openai_error(404, f"no demo provider '{name}'"))
            return True
        provider.received.append(request)
        endpoint = "/" + rest.split("?", 1)[0]
        anthropic = endpoint == "/v1/messages"
        if endpoint not in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            await wire.respond(404,
                          provider_wire.openai_error(404, f"unknown endpoint {endpoint}"))
            return True
        error = provider_wire.anthropic_error if anthropic else provider_wire.openai_error
        behaviour = provider.behaviour
        headers = behaviour.headers
        chunked = behaviour.chunked_json
        latency = behaviour.latency_s
        if latency and behaviour.latency_spread:
            latency *= provider.rng.lognormvariate(0.0, behaviour.latency_spread)
        if behaviour.slow_start_share and provider.rng.random() < behaviour.slow_start_share:
            latency += behaviour.slow_start_s
        # Drawn before the wait: a failure may come sooner than a reply (error_latency_s).
        failing = bool(behaviour.error_rate) and provider.rng.random() < behaviour.error_rate
        if failing and behaviour.error_latency_s is not None:
            latency = behaviour.error_latency_s
        if latency:
            await asyncio.sleep(latency)
        if behaviour.reset_connection:
            wire.abort()
            return False
        if provider.api_key is not None and _credential(request, anthropic) != provider.api_key:
            await wire.respond(401, error(401, "invalid provider API key"), headers=headers)
            return True
        provider.served += 1
        status = behaviour.status
        if behaviour.fail_first and provider.served > behaviour.fail_first:
            status = None
        if failing:
            status = behaviour.error_status
            headers = (*headers, *behaviour.error_headers)
        if status is not None and status != 200:
            await wire.respond(status, behaviour.error_body or error(status, "injected failure"),
                          chunked=chunked, headers=headers)
            return True
        if behaviour.raw_body is not None:
            await wire.respond(200, behaviour.raw_body, behaviour.content_type,
                          chunked=chunked, headers=headers)
            return True
        try:
            payload = request.json()
        except ValueError:
            await wire.respond(400, error(400, "body is not JSON"), headers=headers)
            return True
        refusal = _context_error(behaviour, anthropic, payload, len(request.body))
        if refusal is not None:
            await wire.respond(refusal[0], refusal[1], chunked=chunked, headers=headers)
            return True
        text = behaviour.text
        if behaviour.reply_words is not None:
            text = " ".join(["word"] * max(1, behaviour.reply_words(payload)))
        if behaviour.body_bytes:
            text = " ".join(["x" * _BIG_WORD] * max(1, behaviour.body_bytes // (_BIG_WORD + 1)))
        completion = provider_wire.make_completion(
            f"{'msg' if anthropic else 'chatcmpl'}_demo_{next(self._ids)}",
            provider.name, payload, len(request.body), text, behaviour.call_tools,
            behaviour.cache_tokens, behaviour.cut_tool_calls,
        )
        if endpoint == "/v1/responses":
            if payload.get("stream") is True:
                await wire.respond(400, error(400, "demo Responses API is unary only"))
            else:
                await wire.respond(200, provider_wire.responses_json(completion),
                              chunked=chunked, headers=headers)
            return True
        rate = behaviour.tokens_per_s
        if payload.get("stream") is not True:
            if rate:
                await asyncio.sleep(completion.completion_tokens / rate)
            body = (provider_wire.anthropic_json(completion) if anthropic
                    else provider_wire.openai_json(completion, behaviour.reports_usage))
            if behaviour.invalid_chunked or behaviour.reset_mid_body:
                await wire.broken(body, chunked=behaviour.invalid_chunked)
                return False
            await wire.respond(200, body, chunked=chunked, headers=headers)
            return True
        if anthropic:
            events = provider_wire.anthropic_events(completion)
        else:
            include_usage = behaviour.reports_usage and bool(
                (payload.get("stream_options") or {}).get("include_usage"))
            events = provider_wire.openai_events(completion, include_usage,
                                                 spaced=behaviour.spaced_json,
                                                 timings=behaviour.engine_timings)
        pacing = Pacing(delay_s=1 / rate if rate else behaviour.inter_event_delay_s,
                        first_event_delay_s=behaviour.first_event_delay_s,
                        cut_after=behaviour.fail_after_events,
                        stall_after=behaviour.stall_after_events,
                        end_delay_s=behaviour.stream_end_delay_s)
        try:
            await wire.stream(_stream_events(behaviour, events), pacing, headers)
        except ConnectionError:
            provider.cancelled += 1
            return False
        return True


def _credential(request: RecordedRequest, anthropic: bool) -> str | None:
    """Anthropic accepts `x-api-key` (and, like OpenAI, a bearer token); OpenAI only bearer."""
    if anthropic and "x-api-key" in request.headers:
        return request.headers["x-api-key"]
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def _context_error(behaviour: Behaviour, anthropic: bool, payload: dict[str, Any],
                   body_size: int) -> tuple[int, bytes] | None:
    """The dialect's context-length refusal when the prompt and its output cap do not fit."""
    window = behaviour.context_window_tokens
    if window is None:
        return None
    cap = payload.get("max_completion_tokens") or payload.get("max_tokens")
    requested = provider_wire.prompt_tokens(body_size) + (cap if isinstance(cap, int) else 0)
    if requested <= window:
        return None
    if behaviour.refuses_as is not None:
        return provider_wire.catalogue_refusal(behaviour.refuses_as)
    if anthropic:
        return 400, provider_wire.anthropic_context_error(window, requested)
    if behaviour.vllm_errors:
        return 400, provider_wire.vllm_context_error(window, requested)
    return 400, provider_wire.openai_context_error(window, requested)


def _stream_events(behaviour: Behaviour, events: Iterator[bytes]) -> Iterator[bytes]:
    if behaviour.first_event is not None:
        yield behaviour.first_event
        return
    for sent, event in enumerate(events):
        if sent == behaviour.garbage_after_events:
            yield b"data: {not json at all\n\n"
        yield event


_BIG_WORD = 64 * 1024 - 1
