"""Joined requests straight to the values of their `request_rows` row, in the worker.

`rows.request_row` says what each column holds; this gives the same values (a property
test holds them equal over random decisions and outcomes) without the intermediate row
object, because the worker's CPU is taken from the same machine as the request path
(docs/telemetry.md §8). What a decision's *profile* — its group, strategy, signals, shape,
exclusions, selected target and score figures — makes of the columns is remembered: the
same profiles recur until the observations move, so most rows cost a lookup, a few tuple
joins and the SQL. The columns go in `COLUMNS` order (the INSERT names them).
"""

from __future__ import annotations

import marshal
from collections.abc import Mapping

from sidecar.telemetry.results import RequestResult, usage_charged
from sidecar.telemetry.row_counts import RowCounts
from sidecar.telemetry.rows import (
    MAX_TOKENS_STAGES,
    DecisionRecord,
    JoinedRequest,
    Prices,
    cost_usd,
    origin,
    pairs_text,
    plain_int,
    plain_text,
    score_bucket,
    status_class,
    valid_traceparent,
)
from sidecar.telemetry.schema import REQUEST_COLUMNS, json_text

_HEAD = ("replica", "request_id", "started_at", "caller", "group_name", "admission",
         "observation_count", "traceparent", "cache", "join_kind", "estimated_input_tokens",
         "output_budget", "origin", "canary")
_PROFILE = ("strategy", "cold_start", "signals", "request_shape", "complexity",
            "prompt_features", "selected_scores", "term_value_bucket", "final_share_bucket",
            "exclusions", "max_tokens_filtered", "max_tokens_bucket", "input_size_bucket",
            "candidate_count", "reasoning_effort", "reasoning_budget_tokens", "affinity",
            "probe", "selected_target", "external", "unproven", "policy_version",
            "selection_probability", "selection_reason", "candidate_odds")
_RESULT = ("serving_target", "attempts", "status", "status_class", "error_class",
           "latency_ms", "ttfb_ms", "input_tokens", "output_tokens", "cached_tokens",
           "cost_usd", "cache_write_tokens", "usage_source")
COLUMNS = _HEAD + _PROFILE + _RESULT
assert sorted(COLUMNS) == sorted(REQUEST_COLUMNS), "encode.py misses a request_rows column"
_AFFINITY = _PROFILE.index("affinity")

# A profile's columns and the counter keys its rows add to (row_counts.py).
Profile = tuple[tuple[object, ...], tuple[str, ...] | None, tuple[tuple[str, ...], ...]]
_NO_DECISION: Profile = (("", None, "", "{}", None, "", "{}", None, None, "", False, None,
                          None, 0, None, None, "not_applicable", None, None, None, "", None,
                          None, None, None), None, ())
_NO_RESULT = (None, None, None, "unknown", None, None, None, None, None, None, None, None,
              None)
_MAX_PROFILES = 4096


class RowEncoder:
    __slots__ = ("_prices", "_profiles", "_replica")

    def __init__(self, replica: str, prices: Prices) -> None:
        self._replica = replica
        self._prices = prices
        self._profiles: dict[bytes, Profile] = {}

    @property
    def replica(self) -> str:
        return self._replica

    @property
    def prices(self) -> Prices:
        return self._prices

    def reprice(self, prices: Prices) -> None:
        """A reloaded configuration's prices (one reference swap)."""
        self._prices = prices

    def request(self, item: JoinedRequest, counts: RowCounts) -> tuple[object, ...]:
        """The row's values in `COLUMNS` order; its counters added to `counts`."""
        d, r = item.record, item.result
        if d is None:
            assert r is not None
            head = (self._replica, r.request_id, item.at, "", "", None, None, None, None,
                    item.join, None, None, None, None)
            profile = _NO_DECISION
        else:
            estimate = d.estimate or (None, None)
            head = (self._replica, d.request_id, d.at, d.caller, d.group, d.admission,
                    d.observations, valid_traceparent(d.traceparent) if d.traceparent else None,
                    d.cache, item.join, *estimate,
                    origin(d.traceparent) if d.traceparent else None, d.canary)
            key = marshal.dumps((d.group, d[7:23], d[24:28]))
            found = self._profiles.get(key)
            if found is None:
                if len(self._profiles) >= _MAX_PROFILES:
                    self._profiles.clear()
                found = self._profiles[key] = _profile(d)
            profile = found
        columns, decided, excluded = profile
        tail = _NO_RESULT if r is None else self._result(
            *usage_charged(r, d.estimate if d is not None else None))
        if decided is not None:
            counts[(*decided, tail[3])] += 1
            counts["affinity", d.group, columns[_AFFINITY]] += 1  # type: ignore[union-attr]
            for excluded_key in excluded:
                counts[excluded_key] += 1
        return head + columns + tail

    def _result(self, r: RequestResult, usage_source: str | None) -> tuple[object, ...]:
        return (r.serving_target, r.attempts, r.status, status_class(r.status),
                r.error_class, r.latency_ms, r.ttfb_ms, r.input_tokens, r.output_tokens,
                r.cached_tokens, cost_usd(self._prices.get(r.serving_target or ""), r),
                r.cache_write_tokens, usage_source)


def _profile(d: DecisionRecord) -> Profile:
    shape: Mapping[str, object] = d.request_shape
    scores = d.scores
    reasoning = d.reasoning or {}
    columns = (
        d.strategy, d.cold_start, ",".join(d.signals), json_text(shape), d.complexity,
        ",".join(d.prompt_features),
        json_text({name: score_bucket(value) for name, value in scores.items()} if scores else {}),
        None if d.term_value is None else score_bucket(d.term_value),
        None if d.final_share is None else score_bucket(d.final_share),
        pairs_text(d.exclusions),
        any(s in MAX_TOKENS_STAGES for _, s in d.exclusions),
        plain_text(shape.get("max_tokens_cap")), plain_text(shape.get("input_size")),
        d.candidate_count, plain_text(reasoning.get("effort")),
        plain_int(reasoning.get("budget_tokens")), d.affinity, d.probe, d.selected, d.external,
        pairs_text(d.unproven), d.policy_version or None,
        d.selection[0] if d.selection else None, d.selection[1] if d.selection else None,
        json_text(dict(d.odds)) if d.odds else None,
    )
    if not d.strategy:  # answered before any decision: nothing to count
        return columns, None, ()
    decided = ("decisions", d.group, d.strategy, d.selected or "none")
    excluded = tuple(("threshold_exclusions", d.group, target, stage)
                     for target, stage in d.exclusions if stage.startswith("thresholds."))
    excluded += tuple(("thresholds_unproven", d.group, target, threshold)
                      for target, threshold in d.unproven)
    return columns, decided, excluded
