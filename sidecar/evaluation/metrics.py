"""`/metrics` of shadow policies (docs/policy-evaluation.md §3): per group, since the
current configuration was loaded, how many decisions were also decided under the shadow,
how many agreed, and the mean estimated differences of the shadow's primary from the live
one (a reload starts them again: the counters reset)."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.evaluation.shadow import ShadowDecider, ShadowTally
from sidecar.telemetry.metrics import Metrics

_COUNTERS = (
    ("shadow_decisions", "live decisions also decided under the group's shadow policy",
     "decisions"),
    ("shadow_agreements", "shadow decisions that chose the live primary", "agreements"),
    ("shadow_dropped", "live decisions not shadowed because the queue was full", "dropped"),
)
# Means per shadowed decision (agreements count as 0): gauges, they move both ways.
_MEANS = (
    ("shadow_mean_cost_delta_usd", "shadow's primary minus live's: estimated request cost, "
     "mean per decision", "cost_delta_usd"),
    ("shadow_mean_latency_delta_ms", "shadow's primary minus live's: observed p95 latency, "
     "mean per decision", "latency_delta_ms"),
    ("shadow_mean_error_rate_delta", "shadow's primary minus live's: observed error rate, "
     "mean per decision", "error_rate_delta"),
)


def add_shadow_metrics(metrics: Metrics, current: Callable[[], ShadowDecider | None]) -> None:
    def totals() -> dict[str, ShadowTally]:
        decider = current()
        return decider.totals if decider is not None else {}

    for name, text, attribute in _COUNTERS:
        metrics.add_counter(name, text, ("group",), lambda attribute=attribute: {
            (group,): getattr(tally, attribute) for group, tally in totals().items()})
    for name, text, attribute in _MEANS:
        metrics.add_group_gauge(name, text, lambda attribute=attribute: {
            group: getattr(tally, attribute) / tally.decisions
            for group, tally in totals().items() if tally.decisions})
    metrics.add_group_gauge(
        "shadow_agreement_rate", "shadow decisions that chose the live primary, share",
        lambda: {group: tally.agreements / tally.decisions
                 for group, tally in totals().items() if tally.decisions})
