"""The two things the gateway can decide for an exchange."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.routing.decision import Decision

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
