"""`/metrics` of groups' canaries (docs/rollout.md): decisions by side, withdrawals by
guard, whether each candidate still serves, and the figures its guards last judged."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.rollout.canary_guard import CanaryFigures, CanaryGuard
from sidecar.routing.router import Router
from sidecar.telemetry.metrics import Metrics

_FIGURES = (
    ("canary_window_requests", "the canary's requests within the window its guards judged",
     lambda f: float(f.requests)),
    ("canary_error_rate", "the share of the canary's requests in the window that failed",
     lambda f: f.error_rate),
    ("canary_p95_latency_ms", "p95 latency of the canary's answered requests in the window",
     lambda f: f.p95_latency_ms),
    ("canary_p95_ttft_ms", "p95 time to first byte of the canary's answered requests",
     lambda f: f.p95_ttft_ms),
    ("canary_cost_per_request_usd", "mean priced cost of the canary's answered requests",
     lambda f: f.cost_per_request_usd),
)


def add_canary_metrics(metrics: Metrics, guard: CanaryGuard,
                       router: Callable[[], Router], groups: Callable[[], list[str]]) -> None:
    metrics.add_counter("canary_decisions", "decisions in groups with a canary, by side "
                        "(canary, live, withdrawn)", ("group", "side"),
                        lambda: dict(guard.sides))
    metrics.add_counter("canary_withdrawals", "canaries withdrawn, by the guard breached",
                        ("group", "guard"), lambda: dict(guard.withdrawals))

    def serving() -> dict[str, float]:
        current = router()
        return {group: 0.0 if split.withdrawn else 1.0 for group in groups()
                if (split := current.canary(group)) is not None}

    metrics.add_group_gauge("canary_serving", "1 while the group's canary decides its "
                            "share, 0 once a guard withdrew it", serving)
    for name, text, read in _FIGURES:
        def figures(read: Callable[[CanaryFigures], float | None] = read) -> dict[str, float]:
            return {group: value for group, f in guard.figures().items()
                    if (value := read(f)) is not None}
        metrics.add_group_gauge(name, text, figures)
