"""The soak's traffic (issue 40): callers with the official OpenAI and Anthropic SDKs sending
a fixed rotation of requests (unary and streams, both dialects, callers hanging up
mid-stream, provider faults that fallback rescues and faults that reach the caller), each
checked against what it must get; and a poller of the client listener's `GET /ready` that
counts every answer but 200.

What each kind must get is part of the kind (`Kind.check`), so a request that gets anything
else (another status, a body that is not its dialect's JSON error, a stream that ends
without its end, a timeout) is counted as unexpected with a one-line reason.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar.devstack.soak_stack import CALLER_TOKEN

# An answer by a target of the group (the fake's text: "Hello from <provider> serving …").
HEALTHY = ("Hello from healthy ", "Hello from flaky ")
CLAUDE_HEALTHY = ("Hello from claude ", "Hello from claude-overloaded ")
MESSAGES = [{"role": "user", "content": "Say hello."}]
# A long prompt (512 KiB): every request body reaches the sidecar (routing reads it), so
# these take many times the flow-control windows through Envoy's connections to the
# sidecar. (Several at once crashed Envoy 1.40 while its connection to the sidecar had the
# default 1 MiB buffer: docs/envoy-crash-report.md, tests/e2e/test_large_prompts_at_once.py.)
LONG_PROMPT_BYTES = 512 * 1024
LONG_MESSAGES = [{"role": "user", "content": "Summarise: " + "lorem ipsum " * (
    LONG_PROMPT_BYTES // 12)}]
# Events a caller reads before it hangs up on a dripping stream.
READ_BEFORE_HANGUP = 3


class Unexpected(Exception):
    """A request got something its kind does not allow."""


@dataclass
class Tally:
    """Outcomes by kind: `ok` (as required, a 200 or a rescued fault), `error_as_expected`
    (a fault with nothing to fall back to, answered as its dialect's JSON error),
    `cancelled` (the caller hung up as planned), `unexpected` (with reasons)."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, outcome: str, reason: str = "") -> None:
        self.outcomes[(kind, outcome)] += 1
        if reason:
            self.reasons[f"{kind}: {reason}"[:300]] += 1

    def total(self, outcome: str | None = None) -> int:
        return sum(n for (_, o), n in self.outcomes.items() if outcome in (None, o))


def _openai_error_json(body: bytes) -> None:
    """platform.openai.com/docs/guides/error-codes: `{"error": {"message", "type", …}}`."""
    error = json.loads(body).get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise Unexpected(f"not an OpenAI error body: {body[:120]!r}")


def _anthropic_error_json(body: bytes) -> None:
    """docs.anthropic.com/en/api/errors: `{"type": "error", "error": {"type", "message"}}`."""
    data = json.loads(body)
    error = data.get("error")
    if data.get("type") != "error" or not isinstance(error, dict) or not isinstance(
            error.get("type"), str):
        raise Unexpected(f"not an Anthropic error body: {body[:120]!r}")


class Callers:
    """One OpenAI and one Anthropic SDK client (no SDK retries: each fault is seen as the
    gateway answers it) and the kinds of request they send."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        import anthropic
        import openai

        self.openai = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=CALLER_TOKEN,
                                         max_retries=0, timeout=timeout_s)
        self.anthropic = anthropic.AsyncAnthropic(base_url=base_url, api_key=CALLER_TOKEN,
                                                  max_retries=0, timeout=timeout_s)
        self._openai_errors = openai.APIStatusError
        self._anthropic_errors = anthropic.APIStatusError
        self.kinds: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("chat-flaky unary", lambda: self.chat("chat-flaky")),
            ("chat-flaky stream", lambda: self.chat_stream("chat-flaky")),
            ("chat-limited unary", lambda: self.chat("chat-limited")),
            ("chat-reset stream", lambda: self.chat_stream("chat-reset")),
            ("chat-slow stream", lambda: self.chat_stream("chat-slow")),
            ("chat-broken unary", lambda: self.chat_error("chat-broken", stream=False)),
            ("chat-broken stream", lambda: self.chat_error("chat-broken", stream=True)),
            ("chat-drip hang-up", self.chat_hang_up),
            ("claude-flaky unary", lambda: self.message("claude-flaky")),
            ("claude-flaky stream", lambda: self.message_stream("claude-flaky")),
            ("claude-limited stream", lambda: self.message_stream("claude-limited")),
            ("claude-broken unary", lambda: self.message_error(stream=False)),
            ("claude-broken stream", lambda: self.message_error(stream=True)),
            ("claude-drip hang-up", self.message_hang_up),
            ("claude-bridged unary", lambda: self.message("claude-bridged", HEALTHY)),
            ("claude-bridged stream", lambda: self.message_stream("claude-bridged", HEALTHY)),
            ("chat-reset unary", lambda: self.chat("chat-reset")),
            ("chat-flaky long unary", lambda: self.chat("chat-flaky", LONG_MESSAGES)),
            ("claude-flaky long stream",
             lambda: self.message_stream("claude-flaky", messages=LONG_MESSAGES)),
            ("chat-reset long stream", lambda: self.chat_stream("chat-reset", LONG_MESSAGES)),
            ("claude-bridged long stream",
             lambda: self.message_stream("claude-bridged", HEALTHY, LONG_MESSAGES)),
        ]

    async def close(self) -> None:
        await self.openai.close()
        await self.anthropic.close()

    # --- OpenAI dialect ---------------------------------------------------------------

    async def chat(self, model: str, messages: list[dict[str, str]] = MESSAGES) -> str:
        reply = await self.openai.chat.completions.create(model=model, messages=messages)
        text = reply.choices[0].message.content or ""
        if not text.startswith(HEALTHY) or reply.choices[0].finish_reason != "stop":
            raise Unexpected(f"reply {text[:60]!r} ({reply.choices[0].finish_reason})")
        return "ok"

    async def chat_stream(self, model: str, messages: list[dict[str, str]] = MESSAGES) -> str:
        stream = await self.openai.chat.completions.create(model=model, messages=messages,
                                                           stream=True)
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        if not text.startswith(HEALTHY) or finish != "stop":
            raise Unexpected(f"stream {text[:60]!r} ended with {finish}")
        return "ok"

    async def chat_error(self, model: str, stream: bool) -> str:
        try:
            await self.openai.chat.completions.create(model=model, messages=MESSAGES,
                                                      stream=stream)
        except self._openai_errors as error:
            if error.status_code < 500:
                raise Unexpected(f"status {error.status_code}") from None
            _openai_error_json(error.response.content)
            return "error_as_expected"
        raise Unexpected("a 200 from a group whose only target always fails")

    async def chat_hang_up(self) -> str:
        stream = await self.openai.chat.completions.create(model="chat-drip", messages=MESSAGES,
                                                           stream=True)
        seen = 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
                if seen >= READ_BEFORE_HANGUP:
                    break
        await stream.close()
        if seen < READ_BEFORE_HANGUP:
            raise Unexpected(f"the stream ended after {seen} events")
        return "cancelled"

    # --- Anthropic dialect ------------------------------------------------------------

    async def message(self, model: str, answered_by: tuple[str, ...] = CLAUDE_HEALTHY) -> str:
        reply = await self.anthropic.messages.create(model=model, max_tokens=64,
                                                     messages=MESSAGES)
        text = "".join(block.text for block in reply.content if block.type == "text")
        if not text.startswith(answered_by) or reply.stop_reason != "end_turn":
            raise Unexpected(f"reply {text[:60]!r} ({reply.stop_reason})")
        return "ok"

    async def message_stream(self, model: str, answered_by: tuple[str, ...] = CLAUDE_HEALTHY,
                             messages: list[dict[str, str]] = MESSAGES) -> str:
        stream = await self.anthropic.messages.create(model=model, max_tokens=64,
                                                      messages=messages, stream=True)
        text, stop, ended = "", None, False
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
            elif event.type == "message_delta":
                stop = event.delta.stop_reason
            elif event.type == "message_stop":
                ended = True
        if not text.startswith(answered_by) or stop != "end_turn" or not ended:
            raise Unexpected(f"stream {text[:60]!r} stop {stop}, message_stop {ended}")
        return "ok"

    async def message_error(self, stream: bool) -> str:
        try:
            await self.anthropic.messages.create(model="claude-broken", max_tokens=64,
                                                 messages=MESSAGES, stream=stream)
        except self._anthropic_errors as error:
            if error.status_code < 500:
                raise Unexpected(f"status {error.status_code}") from None
            _anthropic_error_json(error.response.content)
            return "error_as_expected"
        raise Unexpected("a 200 from a group whose only target always fails")

    async def message_hang_up(self) -> str:
        stream = await self.anthropic.messages.create(model="claude-drip", max_tokens=64,
                                                      messages=MESSAGES, stream=True)
        seen = 0
        async for event in stream:
            if event.type == "content_block_delta":
                seen += 1
                if seen >= READ_BEFORE_HANGUP:
                    break
        await stream.close()
        if seen < READ_BEFORE_HANGUP:
            raise Unexpected(f"the stream ended after {seen} events")
        return "cancelled"


async def drive(callers: Callers, tally: Tally, until: float, workers: int,
                pause_s: float) -> None:
    """`workers` callers, each going through the kinds in turn (offset from each other)
    until `until` (time.monotonic), `pause_s` between two requests of one caller."""
    async def worker(offset: int) -> None:
        index = offset
        while time.monotonic() < until:
            kind, send = callers.kinds[index % len(callers.kinds)]
            index += 1
            try:
                tally.add(kind, await send())
            except Unexpected as problem:
                tally.add(kind, "unexpected", str(problem))
            except Exception as error:  # a timeout, a connection error, an SDK error
                tally.add(kind, "unexpected", f"{type(error).__name__}: {error}")
            await asyncio.sleep(pause_s)

    await asyncio.gather(*(worker(n * 5) for n in range(workers)))


class ReadyPoller:
    """A load balancer's view: `GET /ready` on the client listener every `every_s`, on a
    keep-alive connection of its own thread (reopened after a failure); counts every answer
    and every answer but 200 (a failed connection counts as one, with its reason)."""

    def __init__(self, port: int, every_s: float) -> None:
        self.port, self.every_s = port, every_s
        self.polls = 0
        self.not_ready: Counter[str] = Counter()
        self.first_failures: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ready-poller", daemon=True)
        self._started = 0.0

    def __enter__(self) -> ReadyPoller:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def failures(self) -> int:
        return sum(self.not_ready.values())

    def _run(self) -> None:
        connection: http.client.HTTPConnection | None = None
        while not self._stop.wait(self.every_s):
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/ready")
                response = connection.getresponse()
                body = response.read()
                outcome = None if response.status == 200 else describe_answer(response, body)
                if response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as error:
                outcome = type(error).__name__
                if connection is not None:
                    connection.close()
                connection = None
            self.polls += 1
            if outcome is not None:
                self.not_ready[outcome] += 1
                if len(self.first_failures) < 20:
                    self.first_failures.append((time.monotonic() - self._started, outcome))
        if connection is not None:
            connection.close()


class ConsolePoller:
    """An operator console left open through the soak (issue 43): every page, and the
    explain view of the newest decision, fetched every `every_s` from the sidecar's admin
    endpoint; counts the pages and every answer but 200. Over the run the decision ring
    fills and wraps many times, and the telemetry pages read a growing store."""

    PAGES = ("now", "decisions", "usage?period=15m", "errors?period=15m")

    def __init__(self, admin_port: int, every_s: float) -> None:
        self.port, self.every_s = admin_port, every_s
        self.pages = 0
        self.failures: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-poller", daemon=True)

    def __enter__(self) -> ConsolePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _get(self, path: str) -> bytes:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        self.pages += 1
        if response.status != 200:
            self.failures[f"{path.split('?')[0]} {response.status}"] += 1
        return body

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                for page in self.PAGES:
                    body = self._get(f"/console/{page}")
                    if page == "decisions":
                        start = body.find(b'href="/console/decisions/')
                        if start >= 0:
                            end = body.find(b'"', start + 6)
                            self._get(body[start + 6:end].decode())
            except (OSError, http.client.HTTPException) as error:
                self.failures[type(error).__name__] += 1


def describe_answer(response: http.client.HTTPResponse, body: bytes) -> str:
    """A non-200 `/ready` answer as much as tells who gave it: Envoy's health-check filter
    answers with an empty body and `x-envoy-upstream-healthchecked-cluster`, a local reply
    of the router or the overload manager with its own short text."""
    said = {name: response.getheader(name) for name in (
        "x-envoy-upstream-healthchecked-cluster", "x-envoy-immediate-health-check-fail",
        "content-type") if response.getheader(name) is not None}
    return f"{response.status} {body[:80]!r} {said}"


def run_callers(base_url: str, tally: Tally, seconds: float, workers: int,
                pause_s: float) -> None:
    """Traffic for `seconds` on a fresh event loop (a phase of the soak)."""
    async def main() -> None:
        callers = Callers(base_url)
        try:
            await drive(callers, tally, time.monotonic() + seconds, workers, pause_s)
        finally:
            await callers.close()

    asyncio.run(main())


def describe(tally: Tally) -> dict[str, Any]:
    """The tally as plain data (for a report)."""
    kinds: dict[str, dict[str, int]] = {}
    for (kind, outcome), n in sorted(tally.outcomes.items()):
        kinds.setdefault(kind, {})[outcome] = n
    return {"by_kind": kinds, "unexpected_reasons": dict(tally.reasons.most_common(20))}
