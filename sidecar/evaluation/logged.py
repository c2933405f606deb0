"""The logged decisions of a window, read from the telemetry database (SQLite or PostgreSQL)
as plain records: what replay needs and nothing else — safe scalars only, like the rows.

Rows without a decision (refused before routing, log-only joins) are kept: replay counts
them as not evaluable and says why."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.observe.records import request_failed
from sidecar.telemetry.database import Database, sql

_BATCH = 1000
_REQUEST_COLUMNS = (
    "request_id", "started_at", "group_name", "caller", "strategy", "signals", "request_shape",
    "complexity", "prompt_features", "reasoning_effort", "reasoning_budget_tokens",
    "affinity", "probe", "selected_target", "serving_target", "status", "status_class",
    "error_class", "latency_ms", "ttfb_ms", "output_tokens", "cost_usd", "policy_version",
    "selection_probability", "selection_reason", "candidate_odds", "estimated_input_tokens",
    "output_budget")


@dataclass(frozen=True, slots=True)
class LoggedDecision:
    request_id: str
    at: float                           # epoch seconds of the decision
    group: str
    caller: str
    strategy: str                       # "" when answered before any decision
    shape: dict[str, Any]               # request_shape buckets
    complexity: str | None
    features: frozenset[str]
    scanned: bool                       # the logging policy looked for prompt features
    reasoning_effort: str | None
    reasoning_budget: int | None
    affinity: str
    probe: str | None
    selected: str | None                # the primary
    serving: str | None
    status: int | None
    status_class: str
    error_class: str | None
    latency_ms: float | None
    ttfb_ms: float | None
    output_tokens: int | None
    cost_usd: float | None
    policy_version: str | None
    probability: float | None           # the primary's, as logged
    reason: str | None
    odds: dict[str, float] | None
    input_tokens: int | None            # estimated, as routing saw it
    output_budget: int | None

    @property
    def failed(self) -> bool:
        """A client-visible error: no 2xx reached the caller."""
        return self.status_class != "2xx"

    @property
    def finished_at(self) -> float:
        return self.at + (self.latency_ms or 0.0) / 1000


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """An attempt that failed before another target took over (`fallback_transitions`)."""

    at: float
    group: str
    target: str
    failure: str


@dataclass(frozen=True, slots=True)
class MirroredAnswer:
    """A candidate's answer to a mirrored live request (`shadow_requests`, docs/rollout.md
    §4): outcome evidence for a target the logging policy did not send that request to."""

    candidate: str
    latency_ms: float | None
    cost_usd: float | None
    failed: bool


def read_mirrors(db: Database, since: float, until: float, group: str | None = None,
                 max_rows: int = 1_000_000) -> dict[str, list[MirroredAnswer]]:
    """The period's mirrored answers by live request id; empty on a database without
    the table (a sidecar of an earlier version wrote it). Raises ValueError past
    `max_rows`."""
    where, params = _where(db, "at", since, until, group)
    found: dict[str, list[MirroredAnswer]] = {}
    count = 0
    try:
        with db.transaction() as cursor:
            cursor.execute("SELECT live_request_id, candidate, shadow_latency_ms, "
                           "shadow_cost_usd, shadow_status, shadow_error_class "
                           f"FROM shadow_requests WHERE {where}", params)
            while batch := cursor.fetchmany(_BATCH):
                for request_id, candidate, latency, cost, status, error in batch:
                    count += 1
                    if count > max_rows:
                        raise ValueError(f"more than {max_rows:,} mirrored requests in that "
                                         "period: replay a shorter one or one --group")
                    found.setdefault(str(request_id), []).append(MirroredAnswer(
                        str(candidate), _number(latency), _number(cost),
                        request_failed(_whole(status), _text(error))))
    except ValueError:
        raise
    except Exception:  # no such table: nothing was mirrored here
        return {}
    return found


# Rows one replay holds at most (each a few hundred bytes in memory): past it, a narrower
# period or one group is asked for instead of an out-of-memory end.
MAX_ROWS = 5_000_000


def read_log(db: Database, since: float, until: float, group: str | None = None,
             max_rows: int = MAX_ROWS) -> tuple[list[LoggedDecision], list[FailedAttempt]]:
    """The window's decisions (by decision time) and failed attempts (by time). Raises
    ValueError past `max_rows` decisions."""
    with db.transaction() as cursor:
        decisions = []
        for decision in _decisions(cursor, db, since, until, group):
            decisions.append(decision)
            if len(decisions) > max_rows:
                raise ValueError(f"more than {max_rows:,} logged requests in that period: "
                                 "replay a shorter one (--since/--until) or one --group")
        decisions.sort(key=lambda d: d.at)
        attempts = sorted(_attempts(cursor, db, since, until, group), key=lambda a: a.at)
    return decisions, attempts


def _where(db: Database, column: str, since: float, until: float,
           group: str | None) -> tuple[str, list[object]]:
    clauses = [f"{column} >= {{p}}", f"{column} < {{p}}"]
    params: list[object] = [since, until]
    if group is not None:
        clauses.append("group_name = {p}")
        params.append(group)
    return sql(" AND ".join(clauses), db), params


def _decisions(cursor: Any, db: Database, since: float, until: float,
               group: str | None) -> Iterator[LoggedDecision]:
    where, params = _where(db, "started_at", since, until, group)
    cursor.execute(f"SELECT {', '.join(_REQUEST_COLUMNS)} FROM request_rows WHERE {where}",
                   params)
    while batch := cursor.fetchmany(_BATCH):
        for values in batch:
            yield decision_of(dict(zip(_REQUEST_COLUMNS, values, strict=True)))


def decision_of(row: dict[str, Any]) -> LoggedDecision:
    """A row as replay reads it. Rows come from a database others may write: every value is
    checked, and what is not what this version writes becomes absent (replay then counts
    the row as not evaluable, never fails on it)."""
    return LoggedDecision(
        request_id=str(row["request_id"]), at=_number(row["started_at"]) or 0.0,
        group=str(row["group_name"] or ""), caller=str(row["caller"] or ""),
        strategy=_text(row["strategy"]) or "",
        shape=_mapping(row["request_shape"]), complexity=_text(row["complexity"]),
        features=frozenset(f for f in (_text(row["prompt_features"]) or "").split(",") if f),
        scanned="prompt_features" in (_text(row["signals"]) or "").split(","),
        reasoning_effort=_text(row["reasoning_effort"]),
        reasoning_budget=_whole(row["reasoning_budget_tokens"]),
        affinity=_text(row["affinity"]) or "", probe=_text(row["probe"]),
        selected=_text(row["selected_target"]), serving=_text(row["serving_target"]),
        status=_whole(row["status"]), status_class=_text(row["status_class"]) or "unknown",
        error_class=_text(row["error_class"]), latency_ms=_number(row["latency_ms"]),
        ttfb_ms=_number(row["ttfb_ms"]), output_tokens=_whole(row["output_tokens"]),
        cost_usd=_number(row["cost_usd"]), policy_version=_text(row["policy_version"]),
        probability=_number(row["selection_probability"]),
        reason=_text(row["selection_reason"]), odds=_odds(row["candidate_odds"]),
        input_tokens=_whole(row["estimated_input_tokens"]),
        output_budget=_whole(row["output_budget"]))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: object) -> dict[str, Any]:
    loaded = _json(value) if isinstance(value, str) else None
    return loaded if isinstance(loaded, dict) else {}


def _odds(value: object) -> dict[str, float] | None:
    loaded = _mapping(value)
    odds = {k: float(v) for k, v in loaded.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v <= 1}
    return odds or None


def _attempts(cursor: Any, db: Database, since: float, until: float,
              group: str | None) -> Iterator[FailedAttempt]:
    where, params = _where(db, "at", since, until, group)
    cursor.execute(
        f"SELECT at, group_name, from_target, failure FROM fallback_transitions WHERE {where}",
        params)
    for at, group_name, target, failure in cursor.fetchall():
        yield FailedAttempt(float(at), group_name, target, failure)


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
