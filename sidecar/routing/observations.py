"""Observation state as the routing core reads it: per-target rolling-window figures.

The core never reads a store directly; it gets an `ObservationView`. The live store (issue
#4) and a JSON snapshot file (`sidecar explain --observations`) both provide one. Targets are
keyed by ``provider/model_ref``, so a model shared by several groups shares its observations.

Snapshot file format (JSON)::

    {"targets": {"baseten/gpt-oss-120b": {"count": 120, "p95_latency_ms": 850,
                 "p95_ttfb_ms": 210, "p95_ms_per_output_token": 9.5,
                 "p95_work_ms": 2600,
                 "output_tokens_per_s": 95.0, "error_rate": 0.01,
                 "timeout_rate": 0.0, "fallback_rate": 0.02, "cancel_rate": 0.0,
                 "cache_read_share": 0.6}}}

Every figure is optional except `count`; rates are fractions in [0, 1]. The output of
`sidecar observations --format json` is a valid snapshot (its `outcomes` are ignored).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

# The work latency is compared on: a reply of this many output tokens (docs/dynamic-score.md).
REFERENCE_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class TargetObservations:
    count: int = 0
    p95_latency_ms: float | None = None
    p95_ttfb_ms: float | None = None
    # The median time to first byte: hedging's deadline is bounded by a multiple of it.
    p50_ttfb_ms: float | None = None
    p95_ms_per_output_token: float | None = None
    # The p95 of each reply's time on equal work (observe/records.py, Observation.work_ms).
    p95_work_ms: float | None = None
    output_tokens_per_s: float | None = None
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    fallback_rate: float = 0.0
    cancel_rate: float = 0.0
    # Of the input of `ok` replies that reported usage, the share read from the provider's
    # prompt cache: what `cost_score` expects a request's cache reads to be.
    cache_read_share: float | None = None
    # Seconds the provider still asked not to be called (`retry-after` on a 429).
    retry_after_s: float = 0.0

    def latency_ms(self, basis: str) -> float | None:
        """The latency thresholds and `latency_score` compare, by the group's
        `latency_basis`: the observed p95, or the p95 on equal work."""
        return self.work_latency_ms if basis == "work_normalized" else self.p95_latency_ms

    @property
    def work_latency_ms(self) -> float | None:
        """Latency on equal work: the p95 of each reply's time for a reference reply of
        REFERENCE_OUTPUT_TOKENS (a stream: its first event plus the reference length at its
        own pace; a unary reply, whose generation is inside its first byte: its time, scaled
        down when it was longer). A target that receives the long-output requests is not
        slower for it, and a unary reply's generation is not counted twice (issue #31: p95
        TTFB + 256 × p95 ms per token did both). Without usage reported, the plain p95."""
        if self.p95_work_ms is not None:
            return self.p95_work_ms
        return self.p95_latency_ms


NO_OBSERVATIONS = TargetObservations()


class ObservationView(Protocol):
    def get(self, target_key: str, window_seconds: int) -> TargetObservations:
        """Figures for `target_key` over the last `window_seconds`."""
        ...

    def tally(self, target_key: str) -> object:
        """A mark of what has been observed for `target_key` so far (for `since`)."""
        ...

    def since(self, target_key: str, tally: object) -> TargetObservations:
        """Figures over exactly what was observed for `target_key` after `tally` was taken:
        how a probed target is judged, independent of the window's slice width."""
        ...

    def retry_after_s(self, target_key: str) -> float:
        """Seconds `target_key`'s provider still asked not to be called (0: none)."""
        ...


@dataclass(frozen=True)
class ObservationSnapshot:
    """A fixed set of figures (the window is whatever the snapshot was taken over)."""

    targets: Mapping[str, TargetObservations]

    def get(self, target_key: str, window_seconds: int) -> TargetObservations:
        return self.targets.get(target_key, NO_OBSERVATIONS)

    def tally(self, target_key: str) -> object:
        return None

    def since(self, target_key: str, tally: object) -> TargetObservations:
        """A snapshot is one moment: nothing comes after it."""
        return NO_OBSERVATIONS

    def retry_after_s(self, target_key: str) -> float:
        return self.targets.get(target_key, NO_OBSERVATIONS).retry_after_s


EMPTY_SNAPSHOT = ObservationSnapshot({})
_FIELDS = {f.name for f in fields(TargetObservations)}
_RATES = ("error_rate", "timeout_rate", "fallback_rate", "cancel_rate")
_OPTIONAL_RATES = ("cache_read_share",)
# Keys `sidecar observations --format json` adds that routing does not read.
_INFORMATIONAL = ("outcomes",)


class SnapshotFormatError(ValueError):
    """The snapshot document does not follow the documented format."""


def snapshot_from_dict(document: Any) -> ObservationSnapshot:
    if not isinstance(document, dict) or not isinstance(document.get("targets"), dict):
        raise SnapshotFormatError('expected {"targets": {"provider/model_ref": {...}}}')
    targets: dict[str, TargetObservations] = {}
    for key, figures in document["targets"].items():
        if not isinstance(figures, dict):
            raise SnapshotFormatError(f"targets.{key}: expected an object of figures")
        figures = {k: v for k, v in figures.items() if k not in _INFORMATIONAL}
        unknown = set(figures) - _FIELDS
        if unknown:
            raise SnapshotFormatError(f"targets.{key}: unknown figure(s) {sorted(unknown)}")
        targets[key] = TargetObservations(**{
            name: _figure(f"targets.{key}.{name}", name, value)
            for name, value in figures.items()
        })
    return ObservationSnapshot(targets)


def _figure(path: str, name: str, value: Any) -> float | int | None:
    if value is None and name not in ("count", *_RATES):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SnapshotFormatError(f"{path}: must be a finite number")
    if value < 0:
        raise SnapshotFormatError(f"{path}: must not be negative")
    if name in (*_RATES, *_OPTIONAL_RATES) and value > 1:
        raise SnapshotFormatError(f"{path}: a rate must be between 0 and 1")
    if name == "count":
        if value != int(value):
            raise SnapshotFormatError(f"{path}: must be a whole number")
        return int(value)
    return float(value)
