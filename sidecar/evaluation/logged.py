"""The logged decisions of a window, read from the telemetry database (SQLite or PostgreSQL)
as plain records: what replay needs and nothing else — safe scalars only, like the rows.

Rows without a decision (refused before routing, log-only joins) are kept: replay counts
them as not evaluable and says why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.telemetry.database import Database, sql

_BATCH = 1000
_REQUEST_COLUMNS = (
    "request_id", "started_at", "group_name", "caller", "strategy", "request_shape",
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


def read_log(db: Database, since: float, until: float, group: str | None = None,
             ) -> tuple[list[LoggedDecision], list[FailedAttempt]]:
    """The window's decisions (by decision time) and failed attempts (by time)."""
    with db.transaction() as cursor:
        decisions = sorted(_decisions(cursor, db, since, until, group), key=lambda d: d.at)
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
    return LoggedDecision(
        request_id=row["request_id"], at=float(row["started_at"]), group=row["group_name"],
        caller=row["caller"], strategy=row["strategy"] or "",
        shape=_json(row["request_shape"]) or {}, complexity=row["complexity"],
        features=frozenset(f for f in (row["prompt_features"] or "").split(",") if f),
        reasoning_effort=row["reasoning_effort"],
        reasoning_budget=row["reasoning_budget_tokens"], affinity=row["affinity"],
        probe=row["probe"], selected=row["selected_target"], serving=row["serving_target"],
        status=row["status"], status_class=row["status_class"],
        error_class=row["error_class"], latency_ms=row["latency_ms"], ttfb_ms=row["ttfb_ms"],
        output_tokens=row["output_tokens"], cost_usd=row["cost_usd"],
        policy_version=row["policy_version"], probability=row["selection_probability"],
        reason=row["selection_reason"], odds=_json(row["candidate_odds"]),
        input_tokens=row["estimated_input_tokens"], output_budget=row["output_budget"])


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
    except ValueError:
        return None
