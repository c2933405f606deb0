"""Per-connection budgets for what costs the server work but carries no call of Envoy's:
PING, SETTINGS, RST_STREAM of health calls (and, on connections that never made an
authenticated call, of calls already over: Envoy resets every finished ext_proc stream), empty
DATA and empty HEADERS/CONTINUATION frames (docs/grpc-server.md, Limits).

Each is a token bucket (`ServerLimits.flood_burst` frames, refilled at `flood_rate` per
second, on the server's injectable clock); a frame that finds its bucket empty raises
FloodError, which ends the connection with GOAWAY ENHANCE_YOUR_CALM (counted in
`flood_closed`). None of this runs on the DATA path of a non-empty frame: an empty DATA
frame is recognised in a branch the hot path never takes.
"""

from __future__ import annotations

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.frames import ProtocolError


class FloodError(ProtocolError):
    """A peer spent one of its budgets: GOAWAY ENHANCE_YOUR_CALM, then close."""

    def __init__(self, reason: str) -> None:
        super().__init__(f.ENHANCE_YOUR_CALM, reason)


class Budget:
    """A token bucket: `burst` at once, `rate` more per second."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float) -> bool:
        tokens = self.tokens + (now - self.stamp) * self.rate
        self.tokens = tokens if tokens < self.burst else self.burst
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False
