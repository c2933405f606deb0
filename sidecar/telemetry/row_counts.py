"""What each row adds to the `/metrics` counters. Counted where rows are made (the telemetry
worker process), and added to the sidecar's Prometheus counters when the worker reports
(`Metrics.add_counts`): a key is the counter's name and its label values, all configuration
names or fixed enums."""

from __future__ import annotations

from collections import Counter

from sidecar.telemetry.rows import FallbackRow, RequestRow

RowCounts = Counter[tuple[str, ...]]


def count_row(counts: RowCounts, row: RequestRow | FallbackRow) -> None:
    if isinstance(row, FallbackRow):
        counts["fallback_transitions", row.group, row.from_target, row.to_target,
               row.failure] += 1
        return
    if not row.strategy:  # log-only: no decision to count
        return
    counts["decisions", row.group, row.strategy, row.selected_target or "none",
           row.status_class] += 1
    counts["affinity", row.group, row.affinity] += 1
    for pair in row.exclusions.split(",") if row.exclusions else ():
        target, _, stage = pair.partition(":")
        if stage.startswith("thresholds."):
            counts["threshold_exclusions", row.group, target, stage] += 1
    for pair in row.unproven.split(",") if row.unproven else ():
        target, _, threshold = pair.rpartition(":")
        counts["thresholds_unproven", row.group, target, threshold] += 1
