"""What the gRPC server counts about its peers (plain ints: updated on the hot path, read
by the admin endpoint)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(slots=True)
class ServerCounters:
    connections_open: int = 0
    # closed at once because `max_connections` were open
    connections_refused: int = 0
    # no preface + SETTINGS within `handshake_timeout`
    handshake_timeouts: int = 0
    # GOAWAY after `idle_timeout` without an open call
    idle_closed: int = 0
    # GOAWAYs we sent for RFC 9113 violations (each closes its connection)
    protocol_errors: int = 0
    # calls refused for a missing or wrong channel token (never logged one by one)
    unauthenticated_calls: int = 0
    # calls ended for a message over the size limit or with no buffer room left
    calls_resource_exhausted: int = 0
    # calls ended with INVALID_ARGUMENT: a message the handler could not decode
    invalid_messages: int = 0
    # calls ended with INTERNAL: the client ended its side inside a message
    incomplete_messages: int = 0
    # calls a handler failed on (an exception: a bug)
    handler_errors: int = 0
    # connections closed after an unexpected error of the server itself (a bug)
    internal_errors: int = 0
    # bytes reserved right now for unfinished messages, over all connections
    buffered_bytes: int = 0
    # bytes reserved right now for unfinished messages of open-method (health) calls, apart
    # from buffered_bytes and its caps
    open_method_buffered_bytes: int = 0
    # connections ended with GOAWAY ENHANCE_YOUR_CALM: a flood of control frames, empty
    # frames or calls without the token, or too much queued output
    flood_closed: int = 0
    # unauthenticated connections closed to make room for a new one
    connections_evicted: int = 0
    # log lines the rate limiter held back
    log_lines_suppressed: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
