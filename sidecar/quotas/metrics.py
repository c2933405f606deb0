"""Quotas in `/metrics`: refusals by reason, the Redis store's state, and the requests
whose usage is still to be counted."""

from __future__ import annotations

from sidecar.quotas.admission import Quotas
from sidecar.telemetry.metrics import Metrics


def add_quota_metrics(metrics: Metrics, quotas: Quotas) -> None:
    metrics.add_counter("quota_refusals", "requests refused by a caller quota, by limit",
                        ("reason",), lambda: dict(quotas.refusals))
    metrics.add_counter("quota_lease_waits", "requests that waited for this replica's next "
                        "quota lease, by outcome (admitted, refused, timeout)", ("outcome",),
                        lambda: dict(quotas.lease_waits))
    metrics.add_gauges(quotas.gauges)
    shared = quotas.shared
    if shared is not None:
        metrics.add_counter("quota_redis_errors", "reconciliation rounds Redis did not "
                            "answer (admission then uses local counters)", (),
                            lambda: {(): shared.errors})
