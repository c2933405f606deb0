"""Every limit of the gRPC server, with its default, in one place (docs/grpc-server.md has
the table: what each bounds and what happens when it is reached).

The port is a trust boundary: whatever a peer sends, the memory it can make the server hold
and the connections it can keep open are bounded by these numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB
# RFC 9113 §6.9.1: no flow-control window may exceed this.
MAX_WINDOW = 2**31 - 1
# The gRPC length prefix in front of every message.
PREFIX = 5


@dataclass(frozen=True, slots=True)
class ServerLimits:
    # Largest gRPC message accepted; a larger one ends its call with RESOURCE_EXHAUSTED.
    # The sidecar sets it to `limits.max_request_body_bytes` + 1 MiB (for_message_size).
    max_message_bytes: int = 4 * MiB
    # Largest message on the methods anyone may call without the channel token (health):
    # their requests are a service name, so an unauthenticated peer reserves next to nothing.
    open_method_message_bytes: int = 4 * KiB
    # Calls open at once on one connection (announced in SETTINGS); beyond it, REFUSED_STREAM.
    max_concurrent_calls: int = 10_000
    # Connections open at once; a new one beyond it is closed at once.
    max_connections: int = 256
    # Memory reserved for unfinished messages (a message is reserved whole, at its declared
    # size, once its 5-byte prefix has arrived), per connection and over all connections. A
    # message that does not fit ends its call with RESOURCE_EXHAUSTED.
    connection_buffer_bytes: int = 64 * MiB
    total_buffer_bytes: int = 256 * MiB
    # Flow-control credit a peer has before any message is reserved: the initial stream
    # window (SETTINGS_INITIAL_WINDOW_SIZE) and the connection window. Credit for bytes that
    # are consumed (a message dispatched, or discarded) comes back as they are consumed;
    # credit for the rest of a reserved message is granted when it is reserved.
    stream_window: int = 16 * MiB
    connection_window: int = 64 * MiB
    # Largest frame we accept (SETTINGS_MAX_FRAME_SIZE) and largest request header block.
    max_frame_bytes: int = 256 * KiB
    max_header_block_bytes: int = 64 * KiB
    # Seconds a new connection has to send the preface and its SETTINGS frame.
    handshake_timeout: float = 5.0
    # Seconds a connection may stay without an open call before GOAWAY and close. Envoy
    # keeps its pooled connection busy with the access-log stream, so this only reaps
    # connections nobody uses.
    idle_timeout: float = 300.0
    # Log lines of one kind (protocol errors, undecodable messages, handler failures, ...)
    # per interval; beyond them, one "suppressed N similar messages" line.
    log_burst: int = 10
    log_interval: float = 60.0
    # --- what a peer WITHOUT the channel token may cost (docs/grpc-server.md, Limits) ---
    # Open-method (health) calls at once on one connection; a further one is refused with
    # RESOURCE_EXHAUSTED. A probe makes one.
    max_open_method_calls: int = 4
    # Memory all open-method calls together may reserve for unfinished messages, apart
    # from (never counted against) the authenticated calls' buffer caps.
    open_method_buffer_bytes: int = 64 * KiB
    # Seconds an open-method call has to deliver its one request message (which then also
    # frees its reservation); then it ends with RESOURCE_EXHAUSTED.
    open_method_timeout: float = 2.0
    # Calls without the channel token (refused, or open-method calls) one connection may
    # make in its life; the next ends it with GOAWAY ENHANCE_YOUR_CALM. Envoy makes none: its
    # health checks carry the token too (envoy_config/channel.py).
    max_unauthenticated_calls: int = 100
    # Connections that have not (yet) made an authenticated call; a new one beyond it closes
    # the oldest of them (GOAWAY ENHANCE_YOUR_CALM), so Envoy always finds a slot.
    max_unauthenticated_connections: int = 64
    # Per connection and per kind (PING, SETTINGS, RST_STREAM of a call that was not an
    # authenticated one, empty DATA, empty HEADERS/CONTINUATION): a token bucket of
    # `flood_burst` frames refilled at `flood_rate` per second; an empty bucket ends the
    # connection with GOAWAY ENHANCE_YOUR_CALM.
    flood_burst: int = 50
    flood_rate: float = 10.0
    # Bytes our answers may queue on one connection while the peer's windows are closed;
    # beyond it, GOAWAY ENHANCE_YOUR_CALM. (Per call: 2 x its method's message limit; beyond
    # it the call ends with RESOURCE_EXHAUSTED.)
    connection_output_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"ServerLimits.{field.name} must be positive")
        one_message = self.max_message_bytes + PREFIX
        if self.connection_buffer_bytes < one_message:
            raise ValueError("ServerLimits.connection_buffer_bytes must hold one message of "
                             "max_message_bytes (use ServerLimits.for_message_size)")
        if self.total_buffer_bytes < self.connection_buffer_bytes:
            raise ValueError("ServerLimits.total_buffer_bytes must be at least "
                             "connection_buffer_bytes")
        if self.connection_output_bytes < one_message:
            raise ValueError("ServerLimits.connection_output_bytes must hold one message of "
                             "max_message_bytes (use ServerLimits.for_message_size)")
        if not 65_535 <= self.stream_window <= MAX_WINDOW - one_message:
            raise ValueError("ServerLimits.stream_window must be in [65535, 2^31-1 - one "
                             "message]")
        if not 65_535 <= self.connection_window <= MAX_WINDOW // 2:
            raise ValueError("ServerLimits.connection_window must be in [65535, 2^30]")
        if not 16_384 <= self.max_frame_bytes <= 2**24 - 1:
            raise ValueError("ServerLimits.max_frame_bytes must be in [16384, 2^24-1]")

    @classmethod
    def for_message_size(cls, max_message_bytes: int, **others: int | float) -> ServerLimits:
        """The defaults, for messages up to `max_message_bytes` (see with_changes)."""
        return cls().with_changes(max_message_bytes=max_message_bytes, **others)

    def with_changes(self, **changes: int | float) -> ServerLimits:
        """A copy with `changes`. Unless they are given too, the buffer caps grow with the
        message limit so a connection can take two messages of that size at once and the
        server four."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"unknown limits: {', '.join(sorted(unknown))}")
        fields.update(changes)
        one_message = int(fields["max_message_bytes"]) + PREFIX
        if "connection_buffer_bytes" not in changes:
            fields["connection_buffer_bytes"] = max(fields["connection_buffer_bytes"],
                                                    2 * one_message)
        if "connection_output_bytes" not in changes:
            fields["connection_output_bytes"] = max(fields["connection_output_bytes"],
                                                    2 * one_message)
        if "total_buffer_bytes" not in changes:
            fields["total_buffer_bytes"] = max(fields["total_buffer_bytes"], 4 * one_message,
                                               fields["connection_buffer_bytes"])
        return ServerLimits(**fields)  # type: ignore[arg-type]
