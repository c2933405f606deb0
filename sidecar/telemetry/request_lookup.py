"""The rows of the requests of one W3C trace: what `sidecar rollout check` reads back to see
what the gateway did with each request it sent (issue 42).

A caller who sends `traceparent: 00-<trace id>-<span id>-<flags>` finds its request's row
by that trace id. Only the safe columns a row already holds are returned (names, buckets,
numbers: docs/telemetry.md §2), at most MAX_ROWS of them, from at most the last
MAX_SINCE_S seconds: the lookup scans by the started_at index, so what one peer can make it
read is bounded whatever the table's size.
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


def rows_of_trace(db: Database, trace_id: str, since_s: float,
                  now: float | None = None) -> list[dict[str, Any]]:
    """The rows of requests sent with this trace id in the last `since_s` seconds (at most
    MAX_SINCE_S), oldest first."""
    if not valid_trace_id(trace_id):
        raise ValueError("trace: 32 lowercase hexadecimal digits, not all zero")
    since = (time.time() if now is None else now) - min(max(since_s, 1.0), MAX_SINCE_S)
    # The trace id is checked above: a LIKE pattern of hex digits has no wildcard in it.
    query = sql(f"SELECT {', '.join(COLUMNS)} FROM request_rows "
                "WHERE started_at >= {p} AND traceparent LIKE {p} "
                f"ORDER BY started_at LIMIT {MAX_ROWS}", db)
    with db.transaction() as cursor:
        cursor.execute(query, [since, f"00-{trace_id}-%"])
        return [dict(zip(COLUMNS, values, strict=True)) for values in cursor.fetchall()]
