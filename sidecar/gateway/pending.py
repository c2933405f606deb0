"""An authenticated request between Envoy's two messages: what the header phase learned
that the body phase needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.config.models import Caller
from sidecar.dialects.apis import Dialect

if TYPE_CHECKING:
    from sidecar.gateway.runtime import Runtime


@dataclass(frozen=True, slots=True)
class Pending:
    """An authenticated generation request waiting for its body."""

    caller: Caller
    dialect: Dialect
    has_anthropic_version: bool
    stateful_session: bool = False
    request_id: str = ""  # Envoy's x-request-id, for the telemetry join
    traceparent: str = ""  # W3C trace context, checked at join time (telemetry/rows.py)
    session_id: str = ""   # the caller's `x-session-id`, for Chat-to-Responses sessions
    # The caller's cache-control, for groups with a response cache (cache/keys.py).
    cache_lookup: bool = True
    cache_store: bool = True
    # The configuration the request started with: a reload meanwhile does not change its
    # routing (operations/reload.py).
    runtime: Runtime | None = None
    # The caller headers that reach the provider and may change its answer, (name, value)
    # by name: part of a response-cache key (cache/keys.py).
    varying_headers: tuple[tuple[str, str], ...] = ()
