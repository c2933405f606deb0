"""The additive figures of one time slice of one target (or of a sum of slices), and their
wire form for sharing with other replicas (fleet/observations.py).

Everything here adds and subtracts exactly, so the store's running totals and a fleet's
merged slices are the same whatever order contributions arrive in. The wire form is
compact JSON of numbers and outcome names only (never a prompt, caller or key), and
`from_wire` refuses anything out of shape or range: what another replica wrote is read as
untrusted input.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from sidecar.observe.histogram import BUCKETS, Histogram, bucket_of
from sidecar.observe.records import Observation, Outcome

# A published slice is a few hundred bytes; anything far larger is not one of ours.
MAX_WIRE_BYTES = 16_384
_MAX_COUNT = 10**9
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}


@dataclass
class SliceCounts:
    """Additive figures: a slice, or the running total of the live slices."""

    start: int = -1                    # slice number (time // slice_seconds); -1 = unused
    count: int = 0
    outcomes: dict[Outcome, int] = field(default_factory=dict)
    failed_over: int = 0
    latency: Histogram = field(default_factory=Histogram)
    ttfb: Histogram = field(default_factory=Histogram)
    per_token: Histogram = field(default_factory=Histogram)
    work: Histogram = field(default_factory=Histogram)  # each reply's time on equal work
    tokens: float = 0.0
    token_seconds: float = 0.0
    input_tokens: float = 0.0          # of `ok` replies that reported their input
    cache_read_tokens: float = 0.0     # and the part of it read from the prompt cache

    def add(self, observation: Observation) -> None:
        self.add_contribution(Contribution(observation))

    def add_contribution(self, contribution: Contribution) -> None:
        """What one observation adds (the store adds it to a slice, the running total and
        the lifetime: worked out once, added three times)."""
        if contribution.outcome is Outcome.HEDGED_OUT:
            # A hedged primary cancelled before its first byte: it would have taken at
            # least this long. A time figure only; no count or rate counts it.
            if contribution.ttfb is not None:
                self.ttfb.add_to(contribution.ttfb)
            return
        self.count += 1
        outcomes = self.outcomes
        outcomes[contribution.outcome] = outcomes.get(contribution.outcome, 0) + 1
        self.failed_over += contribution.failed_over
        if contribution.outcome is not Outcome.OK:
            return
        if contribution.latency is not None:
            self.latency.add_to(contribution.latency)
        if contribution.ttfb is not None:
            self.ttfb.add_to(contribution.ttfb)
        if contribution.per_token is not None:
            self.per_token.add_to(contribution.per_token)
        if contribution.work is not None:
            self.work.add_to(contribution.work)
        if contribution.timed_tokens:
            self.tokens += contribution.tokens
            self.token_seconds += contribution.token_seconds
        if contribution.input_tokens:
            self.input_tokens += contribution.input_tokens
            self.cache_read_tokens += contribution.cache_read_tokens

    def merge(self, other: SliceCounts, sign: int = 1) -> None:
        self.count += sign * other.count
        for outcome, n in other.outcomes.items():
            remaining = self.outcomes.get(outcome, 0) + sign * n
            if remaining:
                self.outcomes[outcome] = remaining
            else:
                self.outcomes.pop(outcome, None)
        self.failed_over += sign * other.failed_over
        self.latency.merge(other.latency, sign)
        self.ttfb.merge(other.ttfb, sign)
        self.per_token.merge(other.per_token, sign)
        self.work.merge(other.work, sign)
        self.tokens += sign * other.tokens
        self.token_seconds += sign * other.token_seconds
        self.input_tokens += sign * other.input_tokens
        self.cache_read_tokens += sign * other.cache_read_tokens

    def copy(self) -> SliceCounts:
        duplicate = SliceCounts(self.start)
        duplicate.merge(self)
        return duplicate


class Contribution:
    """One observation as the figures a slice adds: its histogram buckets and sums."""

    __slots__ = ("cache_read_tokens", "failed_over", "input_tokens", "latency", "outcome",
                 "per_token", "timed_tokens", "token_seconds", "tokens", "ttfb", "work")
    outcome: Outcome
    failed_over: int
    ttfb: int | None          # histogram bucket indexes (`bucket_of`)
    latency: int | None
    per_token: int | None
    work: int | None
    timed_tokens: bool        # the reply has a throughput: `tokens` over `token_seconds`
    tokens: float
    token_seconds: float
    input_tokens: float
    cache_read_tokens: float

    def __init__(self, observation: Observation) -> None:
        self.outcome = outcome = observation.outcome
        self.failed_over = int(observation.failed_over)
        self.ttfb = _bucket(observation.ttfb_ms)
        self.latency = self.per_token = self.work = None
        self.timed_tokens = False
        self.tokens = self.token_seconds = self.input_tokens = self.cache_read_tokens = 0.0
        if outcome is not Outcome.OK:
            return
        self.latency = _bucket(observation.latency_ms)
        self.per_token = _bucket(observation.ms_per_output_token)
        self.work = _bucket(observation.work_ms)
        if observation.output_tokens_per_s is not None:
            self.timed_tokens = True
            self.tokens = observation.output_tokens or 0
            self.token_seconds = (observation.upstream_ms or 0) / 1000
        if observation.input_tokens:
            self.input_tokens = observation.input_tokens
            self.cache_read_tokens = min(observation.cache_read_tokens or 0,
                                         observation.input_tokens)


def _bucket(value_ms: float | None) -> int | None:
    return None if value_ms is None else bucket_of(value_ms)


def _histograms(counts: SliceCounts) -> tuple[tuple[str, Histogram], ...]:
    """The histograms by their wire keys (a replica of an older release sends no "w": its
    slices then add no work figures, and the others route on what they have)."""
    return (("l", counts.latency), ("t", counts.ttfb), ("p", counts.per_token),
            ("w", counts.work))


def to_wire(counts: SliceCounts) -> bytes:
    """Only what is non-zero: histograms as bucket → count."""
    data: dict[str, object] = {"n": counts.count,
                               "o": {o.value: n for o, n in counts.outcomes.items()}}
    if counts.failed_over:
        data["f"] = counts.failed_over
    for key, histogram in _histograms(counts):
        if histogram.total:
            data[key] = histogram.counts
    for key, value in (("tk", counts.tokens), ("ts", counts.token_seconds),
                       ("in", counts.input_tokens), ("cr", counts.cache_read_tokens)):
        if value:
            data[key] = value
    return json.dumps(data, separators=(",", ":")).encode()


def from_wire(raw: bytes) -> SliceCounts | None:
    """The counts another replica published, or None for anything that is not a well-formed
    slice (the caller counts such entries; it never raises)."""
    if len(raw) > MAX_WIRE_BYTES:
        return None
    try:
        data = json.loads(raw)
        counts = SliceCounts()
        counts.count = _whole(data["n"])
        for name, n in data["o"].items():
            counts.outcomes[_OUTCOMES[name]] = _whole(n)
        if sum(counts.outcomes.values()) != counts.count:
            return None
        counts.failed_over = _whole(data.get("f", 0))
        for key, histogram in _histograms(counts):
            for index, n in data.get(key, {}).items():
                bucket = int(index)
                if not 0 <= bucket < BUCKETS:
                    return None
                histogram.counts[bucket] = _whole(n)
                histogram.total += histogram.counts[bucket]
        counts.tokens = _amount(data.get("tk", 0))
        counts.token_seconds = _amount(data.get("ts", 0))
        counts.input_tokens = _amount(data.get("in", 0))
        counts.cache_read_tokens = _amount(data.get("cr", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return counts


def _whole(value: object) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_COUNT:
        raise ValueError("not a count")
    return value


def _amount(value: object) -> float:
    if type(value) not in (int, float) or not (math.isfinite(value) and 0 <= value < 1e15):
        raise ValueError("not an amount")
    return float(value)
