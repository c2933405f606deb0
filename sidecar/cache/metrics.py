"""The response caches in `/metrics`: entries and bytes held per group, lookups by outcome,
evictions, and the slots of misses waiting for their answer."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.cache.caches import ResponseCaches
from sidecar.cache.store import AnswerStore
from sidecar.telemetry.metrics import Metrics


def add_cache_metrics(metrics: Metrics, current: Callable[[], ResponseCaches | None]) -> None:
    """`current`: the caches now (a reload replaces them); none: the figures are empty."""
    def stores() -> dict[str, AnswerStore]:
        caches = current()
        return caches.stores if caches is not None else {}

    metrics.add_group_gauge("response_cache_entries", "answers held by the response cache",
                            lambda: {g: float(len(s)) for g, s in stores().items()})
    metrics.add_group_gauge("response_cache_bytes", "bytes of answers held by the response "
                            "cache", lambda: {g: float(s.bytes) for g, s in stores().items()})
    metrics.add_counter("response_cache_lookups", "response cache lookups by outcome",
                        ("group", "outcome"), lambda: {
                            key: count for g, s in stores().items()
                            for key, count in (((g, "hit"), s.hits), ((g, "miss"), s.misses))})
    metrics.add_counter("response_cache_evictions", "answers evicted to stay within "
                        "max_entries or max_bytes", ("group",),
                        lambda: {(g,): s.evictions for g, s in stores().items()})
    metrics.add_gauges(lambda: caches.gauges() if (caches := current()) is not None else {})
