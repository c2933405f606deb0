"""What the routing core knows about one request: a small, safe summary, never the prompt."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.apis import Dialect


@dataclass(frozen=True, slots=True)
class RequestSummary:
    group: str
    caller: str
    dialect: Dialect
    stream: bool = False
