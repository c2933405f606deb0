"""`/metrics`: Prometheus metrics of routing, observations and the sidecar itself
(docs/telemetry.md §5), with `prometheus_client` on the sidecar's own registry.

Counters move when the telemetry worker reports the rows it made (row_counts.py); gauges are
read at scrape time from the observation store, the telemetry writer, the join and the gRPC port.
Labels are configuration names and fixed enums only (group, target, strategy, status
class, stage, outcome): their number is bounded by the configuration. No caller names,
tokens or request ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from sidecar.observe.store import ObservationStore
from sidecar.telemetry.timing import HandlingTimes

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_FIGURES = (("p95_latency_ms", "p95 latency over the retention window, ms"),
            ("p95_ttfb_ms", "p95 time to first byte, ms"),
            ("output_tokens_per_s", "output tokens per second"),
            ("error_rate", "share of observations that were errors"),
            ("timeout_rate", "share of observations that timed out"))


class Metrics:
    def __init__(self, store: ObservationStore) -> None:
        self._gauges: list[Callable[[], dict[str, float]]] = []
        self._by_group: list[tuple[str, str, Callable[[], dict[str, float]]]] = []
        self._children: dict[tuple[object, ...], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self._decisions = Counter(
            "sidecar_decisions", "routed requests by group, strategy, selected target and "
            "status class", ["group", "strategy", "target", "status_class"],
            registry=self.registry)
        self._fallbacks = Counter(
            "sidecar_fallback_transitions", "pre-commit failures another target took over",
            ["group", "from_target", "to_target", "failure"], registry=self.registry)
        self._affinity = Counter(
            "sidecar_affinity", "affinity outcomes of routed requests", ["group", "outcome"],
            registry=self.registry)
        self._exclusions = Counter(
            "sidecar_threshold_exclusions", "targets a threshold or ejection kept out of a "
            "decision", ["group", "target", "stage"], registry=self.registry)
        self._unproven = Counter(
            "sidecar_thresholds_unproven", "thresholds a target was over on too little "
            "evidence to act on (not applied)", ["group", "target", "threshold"],
            registry=self.registry)
        self._row_counters = {"decisions": self._decisions, "fallback_transitions":
                              self._fallbacks, "affinity": self._affinity,
                              "threshold_exclusions": self._exclusions,
                              "thresholds_unproven": self._unproven}
        self.registry.register(_ScrapeTime(store, self._gauges, self._by_group))

    def add_gauges(self, read: Callable[[], dict[str, float]]) -> None:
        """Figures read at scrape time, each exposed as `sidecar_<name>`."""
        self._gauges.append(read)

    def add_handling_times(self, times: HandlingTimes) -> None:
        """`sidecar_ext_proc_handling_seconds`: time to handle one ext_proc message."""
        self.registry.register(_Handling(times))

    def add_group_gauge(self, name: str, text: str,
                        read: Callable[[], dict[str, float]]) -> None:
        """A figure per model group, read at scrape time: `sidecar_<name>{group=…}`."""
        self._by_group.append((name, text, read))

    def add_counter(self, name: str, text: str, labels: tuple[str, ...],
                    read: Callable[[], dict[tuple[str, ...], int]]) -> None:
        """A counter kept elsewhere (on the event loop), read at scrape time:
        `sidecar_<name>_total{labels…}`. Its label values must be configuration names or
        fixed enums."""
        self.registry.register(_CountedElsewhere(name, text, labels, read))

    def add_counts(self, counts: Mapping[tuple[str, ...], int]) -> None:
        """Add what the worker counted since its last report (row_counts.py)."""
        for (name, *labels), n in counts.items():
            counter = self._row_counters.get(name)
            if counter is not None:
                self._child(counter, *labels).inc(n)

    def _child(self, counter: Counter, *labels: str) -> Any:
        """`counter.labels(...)`, remembered: labels come from the configuration, so the
        cache is as bounded as the metric's own label sets."""
        key = (id(counter), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        return child

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _ScrapeTime(Collector):
    """Gauges read when Prometheus scrapes, never kept in step on the request path."""

    def __init__(self, store: ObservationStore,
                 gauges: list[Callable[[], dict[str, float]]],
                 by_group: list[tuple[str, str, Callable[[], dict[str, float]]]]) -> None:
        self._store = store
        self._gauges = gauges
        self._by_group = by_group

    def collect(self) -> Iterator[Any]:
        window = self._store.retention_seconds
        count = GaugeMetricFamily("sidecar_target_observations",
                                  "observations in the retention window", labels=["target"])
        families = {name: GaugeMetricFamily(f"sidecar_target_{name}", text, labels=["target"])
                    for name, text in _FIGURES}
        for target in self._store.targets():
            figures = self._store.get(target, window)
            count.add_metric([target], figures.count)
            for name, _ in _FIGURES:
                value = getattr(figures, name)
                if value is not None:
                    families[name].add_metric([target], value)
        yield count
        yield from families.values()
        figures: dict[str, float] = {}
        for read in self._gauges:
            figures |= read()
        for name, value in sorted(figures.items()):
            yield GaugeMetricFamily(f"sidecar_{name}", name.replace("_", " "), value=value)
        for name, text, read in self._by_group:
            family = GaugeMetricFamily(f"sidecar_{name}", text, labels=["group"])
            for group, value in sorted(read().items()):
                family.add_metric([group], value)
            yield family


class _Handling(Collector):
    def __init__(self, times: HandlingTimes) -> None:
        self._times = times

    def collect(self) -> Iterator[Any]:
        buckets = self._times.cumulative()
        yield HistogramMetricFamily(
            "sidecar_ext_proc_handling_seconds", "time the sidecar spends on one ext_proc "
            "message (decode, route, encode)", buckets=buckets, sum_value=self._times.total)


class _CountedElsewhere(Collector):
    def __init__(self, name: str, text: str, labels: tuple[str, ...],
                 read: Callable[[], dict[tuple[str, ...], int]]) -> None:
        self._name = f"sidecar_{name}"
        self._text = text
        self._labels = list(labels)
        self._read = read

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily(self._name, self._text, labels=self._labels)
        for values, count in sorted(self._read().items()):
            family.add_metric(list(values), count)
        yield family
