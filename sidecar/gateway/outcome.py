"""What the gateway can decide for an exchange: a Reply or a Forward at once, or, rarely, one
of them after a wait (an Ask or a LeaseWait)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.routing.decision import Decision

if TYPE_CHECKING:
    from sidecar.external.client import ExternalCalls
    from sidecar.external.v1.router_pb2 import RankRequest
    from sidecar.quotas.counters import Refusal
    from sidecar.routing.strategies import ExternalAnswer

# A body as pieces sent one after another (see ParsedBody.model_replaced).
BodyParts = tuple[bytes | memoryview, ...]


def body_size(parts: BodyParts) -> int:
    return sum(map(len, parts))


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the caller directly; nothing goes upstream."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request upstream with these rewrites applied: the first attempt to
    `attempts[0]`, each retry (before the response started) to the next cluster."""

    attempts: tuple[str, ...]
    set_headers: tuple[tuple[str, str], ...]
    remove_headers: tuple[str, ...]
    body_parts: BodyParts
    decision: Decision
    # The group's `retry_same_target`: how many times in a row a held 5xx or 429 may put
    # the same target next (it travels with the order, envoy_config/attempt_order_lua.py).
    same_target_retries: int = 0
    # ...and the longest `retry-after` of a 429 that still earns it (the group's
    # `wait_for_retry_after_seconds`).
    same_target_wait_s: float = 0.0
    # Whole seconds the primary's stream may take to its first event before the request
    # moves on (gateway/first_event_deadline.py); 0: the group's first-token wait.
    first_event_deadline_s: int = 0

    @property
    def body(self) -> bytes:
        return b"".join(self.body_parts)


@dataclass(frozen=True, slots=True)
class Retarget:
    """Rewrite a retry's copy of the request for its own target: path and model."""

    set_headers: tuple[tuple[str, str], ...]
    remove_headers: tuple[str, ...]
    body_parts: BodyParts

    @property
    def body(self) -> bytes:
        return b"".join(self.body_parts)


@dataclass(frozen=True, slots=True)
class Ask:
    """An external group's request: ask the group's routing service `query`, then
    `resume` with its answer (or failure) for the Reply or Forward (docs/external.md)."""

    group: str
    query: RankRequest
    resume: Callable[[ExternalAnswer], Reply | Forward]
    # The routing services the request started with (a reload may replace them).
    calls: ExternalCalls

    async def fetch(self) -> ExternalAnswer:
        return await self.calls.ask(self.group, self.query)


@dataclass(frozen=True, slots=True)
class LeaseWait:
    """A request whose caller is under its limit while this replica's quota lease is
    empty: wait for the quota round that renews it (asked for at once), then `resume` with
    the admission's answer (None: admitted) for the Reply, Forward or Ask
    (docs/quotas.md §3)."""

    wait: Callable[[], Awaitable[Refusal | None]]
    resume: Callable[[Refusal | None], Reply | Forward | Ask]

    async def fetch(self) -> Refusal | None:
        return await self.wait()


# Outcomes that wait on I/O in a task (extproc/processor.py, ProcessStream._defer).
Deferred = Ask | LeaseWait
