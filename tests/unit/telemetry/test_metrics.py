"""`/metrics` content (docs/telemetry.md §5): counters from joined rows, gauges read at
scrape time, labels from the configuration only."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.row_counts import count_row
from sidecar.telemetry.rows import FallbackRow, request_row


def test_rows_count_and_gauges_are_read_at_scrape_time() -> None:
    store = ObservationStore(refresh_seconds=0)
    store.record(Observation("p/a", Outcome.OK, latency_ms=250.0, ttfb_ms=50.0))
    metrics = Metrics(store)
    depth = {"telemetry_queue_depth": 3.0}
    metrics.add_gauges(lambda: depth)
    metrics.add_group_gauge("affinity_pins", "pins", lambda: {"g": 4.0})
    row = request_row(None, RequestResult("r1", 200, "p/a", 1, "ok"), {}, "joined", 0.0)
    row = replace(row, group="g", strategy="dynamic_score", selected_target="p/a",
                  affinity="hit", exclusions="p/b:thresholds.ejected,p/c:hard_filters.x")
    counts: Counter = Counter()  # as the worker counts and reports them
    for made in (row, row, replace(row, strategy=""),  # log-only: not a decision
                 FallbackRow("r1", 0.0, "g", "p/b", "p/a", 1, "server_error")):
        count_row(counts, made)
    metrics.add_counts(counts)
    depth["telemetry_queue_depth"] = 7.0
    text = metrics.exposition().decode()
    assert ('sidecar_decisions_total{group="g",status_class="2xx",strategy="dynamic_score",'
            'target="p/a"} 2.0') in text
    assert 'sidecar_affinity_total{group="g",outcome="hit"} 2.0' in text
    assert ('sidecar_threshold_exclusions_total{group="g",stage="thresholds.ejected",'
            'target="p/b"} 2.0') in text
    assert "hard_filters.x" not in text  # only threshold and ejection stages
    assert ('sidecar_fallback_transitions_total{failure="server_error",from_target="p/b",'
            'group="g",to_target="p/a"} 1.0') in text
    assert 'sidecar_target_observations{target="p/a"} 1.0' in text
    assert 'sidecar_target_p95_latency_ms{target="p/a"}' in text
    assert "sidecar_telemetry_queue_depth 7.0" in text
    assert 'sidecar_affinity_pins{group="g"} 4.0' in text
    assert "r1" not in text  # no request ids


def test_handling_times_are_a_prometheus_histogram() -> None:
    from sidecar.telemetry.timing import HandlingTimes

    times = HandlingTimes()
    for seconds in (20e-6, 20e-6, 80e-6, 0.3, 5.0):
        times.observe(seconds)
    metrics = Metrics(ObservationStore())
    metrics.add_handling_times(times)
    text = metrics.exposition().decode()
    assert 'sidecar_ext_proc_handling_seconds_bucket{le="2.5e-05"} 2.0' in text
    assert 'sidecar_ext_proc_handling_seconds_bucket{le="0.0001"} 3.0' in text
    assert 'sidecar_ext_proc_handling_seconds_bucket{le="1.0"} 4.0' in text
    assert 'sidecar_ext_proc_handling_seconds_bucket{le="+Inf"} 5.0' in text
    assert "sidecar_ext_proc_handling_seconds_count 5.0" in text
    assert "sidecar_ext_proc_handling_seconds_sum 5.30012" in text
