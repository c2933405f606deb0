"""`/metrics` of groups' shadow traffic (docs/rollout.md §4): sampled decisions by outcome
(sent, or the bound or reason that stopped them), the candidate's answers, today's spend
and requests in flight, and the paired figures. The candidate's own latency, time to first
byte and error rates beside the live targets' are the per-target observation gauges
(`sidecar_target_*`), which its answers feed."""

from __future__ import annotations

from sidecar.rollout.shadow_traffic import ShadowTraffic
from sidecar.telemetry.metrics import Metrics


def add_shadow_traffic_metrics(metrics: Metrics, mirror: ShadowTraffic) -> None:
    metrics.add_counter("shadow_traffic_requests", "sampled live decisions of groups with "
                        "shadow traffic, by outcome: sent, or what stopped the mirror "
                        "(max_concurrent, max_per_minute, max_daily_usd, same_target, "
                        "needs_bridge, untranslatable, dialect, no_listener, "
                        "failed_to_send)", ("group", "outcome"),
                        lambda: dict(mirror.outcomes))
    metrics.add_counter("shadow_traffic_answers", "mirrored requests by the candidate's "
                        "result (answered, failed)", ("group", "result"),
                        lambda: dict(mirror.answers))
    metrics.add_counter("shadow_traffic_pairs", "mirrored requests paired with their live "
                        "answer", ("group",),
                        lambda: {(group, ): int(sums[0]) for group, sums in mirror.pairs.items()})
    metrics.add_group_gauge("shadow_traffic_spend_usd", "what the mirror spent today (UTC), "
                            "estimates of requests in flight included", mirror.spend)
    metrics.add_group_gauge("shadow_traffic_in_flight", "mirrored requests in flight",
                            mirror.in_flight)
    metrics.add_group_gauge(
        "shadow_traffic_both_answered_rate", "paired requests both sides answered, share",
        lambda: {group: sums[1] / sums[0] for group, sums in mirror.pairs.items() if sums[0]})
    metrics.add_group_gauge(
        "shadow_traffic_mean_output_ratio", "the candidate's output tokens over the live "
        "answer's, mean over pairs both answered",
        lambda: {group: sums[2] / sums[3] for group, sums in mirror.pairs.items() if sums[3]})
