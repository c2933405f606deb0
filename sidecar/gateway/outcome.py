"""The two things the gateway can decide for an exchange."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.routing.decision import Decision

if TYPE_CHECKING:
    from sidecar.external.client import ExternalCalls
    from sidecar.external.v1.router_pb2 import RankRequest
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
    `resume` with its answer (or failure) for the Reply or Forward. The only outcome that
    waits on I/O (docs/external.md)."""

    group: str
    query: RankRequest
    resume: Callable[[ExternalAnswer], Reply | Forward]
    # The routing services the request started with (a reload may replace them).
    calls: ExternalCalls
