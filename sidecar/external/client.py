"""Asking the external routing service, over gRPC (the generated stub) or HTTP JSON
(protobuf's JSON mapping of the same messages), within the group's deadline.

Runs on the sidecar's event loop: a request of an external group waits here while every
other request keeps the synchronous path (extproc/processor.py). The service's answer is
bounded (`MAX_ANSWER_BYTES`); what it says is checked by the routing core, not here."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Protocol
from urllib.parse import urlsplit

from google.protobuf import json_format

from sidecar.config.models import SidecarConfig
from sidecar.config.strategy_policies import ExternalPolicy
from sidecar.dependency_names import service_url
from sidecar.external.query import QueryBuilder
from sidecar.external.v1.router_pb2 import RankRequest, RankResponse
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.routing.strategies import ExternalAnswer

log = logging.getLogger("sidecar.external")
_limited = LogLimiter(log, burst=10, interval=60.0)

# An answer is a list of target labels: far below this.
MAX_ANSWER_BYTES = 64 * 1024


class Ranker(Protocol):
    async def rank(self, request: RankRequest, timeout_s: float) -> tuple[str, ...]:
        """The service's target labels, in attempt order; raises on any failure."""
        ...

    async def close(self) -> None: ...


class GrpcRanker:
    """`grpc://host:port`: the ExternalRouter service over one HTTP/2 channel, opened on
    first use (on the event loop that serves ext_proc)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._target = f"{parts.hostname}:{parts.port}"
        self._stub: object | None = None
        self._channel: object | None = None

    async def rank(self, request: RankRequest, timeout_s: float) -> tuple[str, ...]:
        if self._stub is None:
            import grpc

            from sidecar.external.v1.router_pb2_grpc import ExternalRouterStub

            self._channel = grpc.aio.insecure_channel(
                self._target, options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)])
            self._stub = ExternalRouterStub(self._channel)
        response = await self._stub.Rank(request, timeout=timeout_s)  # type: ignore[attr-defined]
        return tuple(response.targets)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()  # type: ignore[attr-defined]


class HttpRanker:
    """`http(s)://…`: POST the request as JSON, read a JSON answer of at most
    MAX_ANSWER_BYTES."""

    def __init__(self, url: str, max_connections: int) -> None:
        import httpx

        self._url = url
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections), trust_env=False)

    async def rank(self, request: RankRequest, timeout_s: float) -> tuple[str, ...]:
        body = json_format.MessageToJson(request, indent=None).encode()
        async with self._client.stream(
                "POST", self._url, content=body, timeout=timeout_s,
                headers={"content-type": "application/json"}) as response:
            response.raise_for_status()
            answer = bytearray()
            async for chunk in response.aiter_bytes():
                answer += chunk
                if len(answer) > MAX_ANSWER_BYTES:
                    raise ValueError("answer too large")
        parsed = json_format.Parse(bytes(answer), RankResponse(), ignore_unknown_fields=True)
        return tuple(parsed.targets)

    async def close(self) -> None:
        await self._client.aclose()


class _Group:
    __slots__ = ("build", "policy", "ranker", "waiting", "where")

    def __init__(self, policy: ExternalPolicy, build: QueryBuilder, ranker: Ranker) -> None:
        self.policy = policy
        self.build = build
        self.ranker = ranker
        self.waiting = 0
        self.where = service_url(policy.url)  # for log lines: no query (it may hold a key)


class ExternalCalls:
    """The routing services of all external groups, with per-group bounds: at most
    `max_concurrent_calls` waiting (more fall back at once, `busy`), each for at most
    `timeout_ms`. `outcomes` counts decisions by (group, outcome) for /metrics."""

    def __init__(self, config: SidecarConfig) -> None:
        self._groups: dict[str, _Group] = {}
        for name, group in config.models.items():
            policy = group.external
            if group.strategy != "external" or policy is None:
                continue
            ranker: Ranker = (GrpcRanker(policy.url) if policy.is_grpc
                              else HttpRanker(policy.url, policy.max_concurrent_calls))
            self._groups[name] = _Group(policy, QueryBuilder(group), ranker)
        self.outcomes: Counter[tuple[str, str]] = Counter()

    @classmethod
    def for_config(cls, config: SidecarConfig,
                   previous: ExternalCalls | None = None) -> ExternalCalls | None:
        """The clients `config` needs (None: no external group), counting on where
        `previous` (the configuration before a reload) left off."""
        if not any(group.strategy == "external" for group in config.models.values()):
            return None
        calls = cls(config)
        if previous is not None:
            calls.outcomes = previous.outcomes
        return calls

    def __contains__(self, group: str) -> bool:
        return group in self._groups

    def builder(self, group: str) -> QueryBuilder:
        return self._groups[group].build

    async def ask(self, group: str, request: RankRequest) -> ExternalAnswer:
        state = self._groups[group]
        if state.waiting >= state.policy.max_concurrent_calls:
            return ExternalAnswer(failure="busy")
        state.waiting += 1
        timeout_s = state.policy.timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                return ExternalAnswer(await state.ranker.rank(request, timeout_s))
        except TimeoutError:
            return ExternalAnswer(failure="timeout")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failure = _failure(exc)
            _limited.warning("external_failed", "external routing service of group %s "
                             "(%s): %s", group, state.where, failure[1])
            return ExternalAnswer(failure=failure[0])
        finally:
            state.waiting -= 1

    async def close(self) -> None:
        for state in self._groups.values():
            await state.ranker.close()


def _failure(exc: Exception) -> tuple[str, str]:
    """(outcome, what to log): the error's kind and status only, never its text, which
    may echo what was sent."""
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.aio.AioRpcError
        name = getattr(code(), "name", "UNKNOWN")
        return ("timeout" if name == "DEADLINE_EXCEEDED" else "error"), f"gRPC {name}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status is not None:
        return "error", f"HTTP {status}"
    return "error", type(exc).__name__
