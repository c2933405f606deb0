"""The rows of `sidecar rollout check`'s requests of one W3C trace: what the check reads
back to see what the gateway did with each request it sent (issue 42).

The check sends `traceparent: 00-<trace id>-<span id>-<flags>` with a trace id of its own
prefix, and its rows say `origin = 'rollout_check'`; only such rows are found (a trace id
is no secret: callers propagate theirs, and the sidecar exports them in spans, so this is
not a way to read any other request's row). The lookup goes through a partial index that
holds checklist rows only, so what one peer can make it read is the checklist's rows of at
most the last MAX_SINCE_S seconds, whatever the table's size; at most MAX_ROWS come back,
with only the safe columns a row already holds (names, buckets, numbers: docs/telemetry.md
§2).
"""

from __future__ import annotations

import re
import time
from typing import Any

from sidecar.telemetry.database import Database, sql

MAX_ROWS = 50
MAX_SINCE_S = 3_600.0
TRACE_ID = re.compile(r"[0-9a-f]{32}")
COLUMNS = ("request_id", "started_at", "replica", "caller", "group_name", "strategy",
           "complexity", "prompt_features", "exclusions", "max_tokens_filtered", "admission",
           "affinity", "probe", "selected_target", "serving_target", "attempts", "status",
           "status_class", "error_class", "latency_ms", "ttfb_ms", "input_tokens",
           "output_tokens", "cost_usd", "join_kind", "origin", "traceparent")


def valid_trace_id(text: str) -> bool:
    return TRACE_ID.fullmatch(text) is not None and text != "0" * 32


def lookup_query(db: Database) -> str:
    """The lookup, in the database's placeholders: the checklist's rows since a time whose
    traceparent has a trace id (the partial index `request_rows_checklist` serves it)."""
    return sql(f"SELECT {', '.join(COLUMNS)} FROM request_rows "
               "WHERE origin = 'rollout_check' AND started_at >= {p} "
               f"AND traceparent LIKE {{p}} ORDER BY started_at LIMIT {MAX_ROWS}", db)


def rows_of_trace(db: Database, trace_id: str, since_s: float,
                  now: float | None = None) -> list[dict[str, Any]]:
    """The rows of requests sent with this trace id in the last `since_s` seconds (at most
    MAX_SINCE_S), oldest first."""
    if not valid_trace_id(trace_id):
        raise ValueError("trace: 32 lowercase hexadecimal digits, not all zero")
    since = (time.time() if now is None else now) - min(max(since_s, 1.0), MAX_SINCE_S)
    with db.transaction() as cursor:
        # The trace id is checked above: a LIKE pattern of hex digits has no wildcard in it.
        cursor.execute(lookup_query(db), [since, f"00-{trace_id}-%"])
        return [dict(zip(COLUMNS, values, strict=True)) for values in cursor.fetchall()]
