"""Mergeable aggregates of request rows: what reports print and daily rollups store
(docs/telemetry.md §4–§5).

One `Aggregate` sums a set of rows: counts, tokens, cost, error classes, every decision
bucket as a (dimension, bucket) count, and latencies. Latencies are kept exact while they
come from raw rows and, once rolled up, in the observation store's log-bucketed histogram
(observe/histogram.py); merging the two turns the exact ones into the histogram, so a
report spanning expired days gives percentiles to within 2.2 %, while every count and sum
stays exact.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sidecar.observe.histogram import Histogram

DAY_S = 86_400

# Row columns counted bucket by bucket in a decisions report, in the order they print.
COLUMN_DIMENSIONS = ("strategy", "cold_start", "complexity", "affinity", "probe",
                     "selected_target", "final_share_bucket", "term_value_bucket",
                     "max_tokens_filtered", "max_tokens_bucket", "input_size_bucket",
                     "admission", "external", "cache", "reasoning_effort", "status_class",
                     "join_kind")
# Dimensions a row holds several buckets of (lists and maps).
LIST_DIMENSIONS = ("signals", "prompt_features", "exclusion_stages", "score_buckets",
                   "request_shape")
DIMENSIONS = COLUMN_DIMENSIONS + LIST_DIMENSIONS


def day_of(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d")


def day_start(day: str) -> float:
    return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()


def decision_buckets(row: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Every (dimension, bucket) a raw request row counts in."""
    for dimension in COLUMN_DIMENSIONS:
        yield dimension, _text(dimension, row.get(dimension))
    for name in _split(row.get("signals")):
        yield "signals", name
    for name in _split(row.get("prompt_features")):
        yield "prompt_features", name
    for pair in _split(row.get("exclusions")):
        if ":" in pair:
            yield "exclusion_stages", pair.split(":", 1)[1]
    for name, value in _mapping(row.get("selected_scores")).items():
        yield "score_buckets", f"{name}={value}"
    for name, value in _mapping(row.get("request_shape")).items():
        yield "request_shape", f"{name}={_text('', value)}"


@dataclass
class Aggregate:
    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    estimated_requests: int = 0  # charged by estimate: no usage could be read
    cost_usd: float = 0.0
    latencies: list[float] = field(default_factory=list)        # exact, from raw rows
    histogram: Histogram = field(default_factory=Histogram)     # rolled-up rows
    error_classes: Counter[str] = field(default_factory=Counter)
    buckets: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add_row(self, row: Mapping[str, Any], exact: bool = True,
                decisions: bool = True) -> None:
        self.requests += 1
        error = row.get("error_class")
        if error not in (None, "ok"):
            self.errors += 1
            self.error_classes[error] += 1
        self.input_tokens += row.get("input_tokens") or 0
        self.output_tokens += row.get("output_tokens") or 0
        self.cached_tokens += row.get("cached_tokens") or 0
        self.cache_write_tokens += row.get("cache_write_tokens") or 0
        self.estimated_requests += row.get("usage_source") == "estimated"
        self.cost_usd += row.get("cost_usd") or 0.0
        latency = row.get("latency_ms")
        if latency is not None:
            if exact:
                self.latencies.append(latency)
            else:
                self.histogram.add(latency)
        if decisions:
            self.buckets.update(decision_buckets(row))

    def merge(self, other: Aggregate) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.estimated_requests += other.estimated_requests
        self.cost_usd += other.cost_usd
        self.latencies.extend(other.latencies)
        self.histogram.merge(other.histogram)
        self.error_classes.update(other.error_classes)
        self.buckets.update(other.buckets)

    def percentile(self, fraction: float) -> float | None:
        if not self.histogram.total:
            return percentile(self.latencies, fraction)
        return self._all_in_histogram().percentile(fraction)

    def histogram_json(self) -> str:
        counts = self._all_in_histogram().counts
        return json.dumps({str(k): v for k, v in sorted(counts.items())})

    def _all_in_histogram(self) -> Histogram:
        merged = Histogram()
        merged.merge(self.histogram)
        for value in self.latencies:
            merged.add(value)
        return merged


def histogram_from_json(text: str | None) -> Histogram:
    histogram = Histogram()
    histogram.counts = {int(k): int(v) for k, v in json.loads(text or "{}").items()}
    histogram.total = sum(histogram.counts.values())
    return histogram


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest rank, as the observation windows report it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def usage_entry(by: str, key: str, total: Aggregate) -> dict[str, Any]:
    return {
        by: key,
        "requests": total.requests,
        "errors": total.errors,
        "input_tokens": total.input_tokens,
        "output_tokens": total.output_tokens,
        "cached_tokens": total.cached_tokens,
        "cache_write_tokens": total.cache_write_tokens,
        "estimated_requests": total.estimated_requests,
        "cost_usd": round(total.cost_usd, 6),
        "latency_p50_ms": total.percentile(0.50),
        "latency_p95_ms": total.percentile(0.95),
        "latency_p99_ms": total.percentile(0.99),
        "error_classes": dict(sorted(total.error_classes.items())),
    }


def decisions_entry(by: str, key: str, total: Aggregate) -> dict[str, Any]:
    entry: dict[str, Any] = {by: key, "requests": total.requests}
    for dimension in DIMENSIONS:
        entry[dimension] = {}
    for (dimension, value), count in sorted(total.buckets.items()):
        entry[dimension][value] = count
    return entry


def _text(dimension: str, value: object) -> str:
    if dimension == "max_tokens_filtered":  # a boolean (SQLite stores 0/1)
        return "yes" if value else "no"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def _split(text: object) -> Iterable[str]:
    return [part for part in str(text).split(",") if part] if text else []


def _mapping(value: object) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value:
        loaded = json.loads(value)
        return loaded if isinstance(loaded, dict) else {}
    return {}
