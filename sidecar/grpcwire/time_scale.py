"""A test knob: the gRPC port's timers, and Envoy's health checks of the sidecar, k times
faster, so a soak of minutes crosses what production crosses in hours (issue 40, "long runs
as a test": tests/e2e/test_soak.py, bench/soak.py).

Hidden on purpose: read from the environment variable `SIDECAR_TEST_TIME_SCALE` (a number
>= 1, default 1), not a configuration field or a flag, because an operator has no reason to
run these timers at another speed than the one docs/grpc-server.md states. `sidecar up`
renders Envoy's bootstrap and starts the gRPC server in one process, so one variable moves
both halves together; with `sidecar render-envoy` and `sidecar serve` apart, set it on both.

What scales (divided by k): the durations of `ServerLimits` (`handshake_timeout`,
`idle_timeout`, `open_method_timeout`, `log_interval`), Envoy's health-check interval of the
sidecar's cluster (envoy_config/readiness.py) and Envoy's idle timeout of its connections
to the sidecar (always 0.8 x the sidecar's, envoy_config/clusters.py). What does not: the
counts and sizes (`max_unauthenticated_calls`, `flood_burst`, windows, buffers: the run
crosses the production numbers, only sooner), the flood budgets' refill rate (`flood_rate`
stays 10 a second, so Envoy's control frames, which come up to k times as often, are held
to a budget k times stricter than in production), and the health check's timeout (1 s: a
deadline on the sidecar's answer; scaled, it would measure the machine's scheduling).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sidecar.grpcwire.limits import ServerLimits

TIME_SCALE_ENV = "SIDECAR_TEST_TIME_SCALE"
_SCALED_DURATIONS = ("handshake_timeout", "idle_timeout", "open_method_timeout",
                     "log_interval")


def time_scale(environ: Mapping[str, str] | None = None) -> float:
    """k from `SIDECAR_TEST_TIME_SCALE` (1 when unset); a value that is not a number >= 1 is
    an error, never silently the default."""
    raw = (os.environ if environ is None else environ).get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not 1.0 <= scale <= 1000.0:
        raise ValueError(f"{TIME_SCALE_ENV} must be a number from 1 to 1000, not {raw!r}")
    return scale


def scaled_limits(limits: ServerLimits, scale: float) -> ServerLimits:
    """`limits` with its durations divided by `scale` (see the module's docstring)."""
    if scale == 1.0:
        return limits
    return limits.with_changes(**{name: getattr(limits, name) / scale
                                  for name in _SCALED_DURATIONS})
