"""The telemetry schema and its migrations, one SQL text for SQLite and PostgreSQL.

Numbered migrations run in order at start; `schema_migrations` records which ran. Column
names avoid SQL keywords (`group_name`, `join_kind`). Maps (request-shape buckets, the
selected target's score buckets) are JSON text, so both engines store them alike.
"""

from __future__ import annotations

import json
from dataclasses import fields
from operator import attrgetter

from sidecar.telemetry.rows import CanaryEventRow, FallbackRow, MirrorRow, RequestRow, ShadowRow

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE request_rows (
            request_id TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL,
            replica TEXT NOT NULL, caller TEXT NOT NULL, group_name TEXT NOT NULL,
            strategy TEXT NOT NULL, cold_start TEXT, signals TEXT NOT NULL,
            request_shape TEXT NOT NULL, complexity TEXT, prompt_features TEXT NOT NULL,
            selected_scores TEXT NOT NULL, term_value_bucket TEXT, final_share_bucket TEXT,
            exclusions TEXT NOT NULL, max_tokens_filtered BOOLEAN NOT NULL,
            max_tokens_bucket TEXT, input_size_bucket TEXT, admission TEXT,
            observation_count INTEGER, candidate_count INTEGER NOT NULL,
            reasoning_effort TEXT, reasoning_budget_tokens INTEGER, affinity TEXT NOT NULL,
            probe TEXT, selected_target TEXT, serving_target TEXT, attempts INTEGER,
            status INTEGER, status_class TEXT NOT NULL, error_class TEXT,
            latency_ms DOUBLE PRECISION, ttfb_ms DOUBLE PRECISION, input_tokens BIGINT,
            output_tokens BIGINT, cached_tokens BIGINT, cost_usd DOUBLE PRECISION,
            join_kind TEXT NOT NULL)""",
        "CREATE INDEX request_rows_started_at ON request_rows (started_at)",
        """CREATE TABLE fallback_transitions (
            request_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, replica TEXT NOT NULL,
            group_name TEXT NOT NULL, from_target TEXT NOT NULL, to_target TEXT NOT NULL,
            attempt INTEGER NOT NULL, failure TEXT NOT NULL)""",
        "CREATE INDEX fallback_transitions_at ON fallback_transitions (at)",
    )),
    (2, (  # daily rollups (docs/telemetry.md §5): kept after raw rows expire
        """CREATE TABLE rollup_days (
            day TEXT PRIMARY KEY, rolled_at DOUBLE PRECISION NOT NULL,
            raw_expired BOOLEAN NOT NULL)""",
        """CREATE TABLE daily_usage (
            day TEXT NOT NULL, group_name TEXT NOT NULL, caller TEXT NOT NULL,
            serving_target TEXT NOT NULL, requests BIGINT NOT NULL, errors BIGINT NOT NULL,
            input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
            cached_tokens BIGINT NOT NULL, cost_usd DOUBLE PRECISION NOT NULL,
            latency_histogram TEXT NOT NULL, error_classes TEXT NOT NULL)""",
        "CREATE INDEX daily_usage_day ON daily_usage (day)",
        """CREATE TABLE daily_decisions (
            day TEXT NOT NULL, group_name TEXT NOT NULL, caller TEXT NOT NULL,
            serving_target TEXT NOT NULL, dimension TEXT NOT NULL, bucket TEXT NOT NULL,
            requests BIGINT NOT NULL)""",
        "CREATE INDEX daily_decisions_day ON daily_decisions (day)",
        """CREATE TABLE daily_fallbacks (
            day TEXT NOT NULL, group_name TEXT NOT NULL, from_target TEXT NOT NULL,
            to_target TEXT NOT NULL, failure TEXT NOT NULL, transitions BIGINT NOT NULL)""",
        "CREATE INDEX daily_fallbacks_day ON daily_fallbacks (day)",
    )),
    (3, (  # the W3C traceparent of the request, linking a row to its trace
        "ALTER TABLE request_rows ADD COLUMN traceparent TEXT",
    )),
    (4, (  # strategy: external's outcome and the response cache's (issue #17)
        "ALTER TABLE request_rows ADD COLUMN external TEXT",
        "ALTER TABLE request_rows ADD COLUMN cache TEXT",
    )),
    (5, (  # prompt-cache writes, priced apart (issue #27); input_tokens includes them
        "ALTER TABLE request_rows ADD COLUMN cache_write_tokens BIGINT",
        "ALTER TABLE daily_usage ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0",
    )),
    (6, (  # usage charged by estimate when none could be read (issue #28)
        "ALTER TABLE request_rows ADD COLUMN usage_source TEXT",
        "ALTER TABLE daily_usage ADD COLUMN estimated_requests BIGINT NOT NULL DEFAULT 0",
    )),
    (7, (  # every decision's odds and policy, unproven thresholds, size for replay (#31)
        "ALTER TABLE request_rows ADD COLUMN unproven TEXT",
        "ALTER TABLE request_rows ADD COLUMN policy_version TEXT",
        "ALTER TABLE request_rows ADD COLUMN selection_probability DOUBLE PRECISION",
        "ALTER TABLE request_rows ADD COLUMN selection_reason TEXT",
        "ALTER TABLE request_rows ADD COLUMN candidate_odds TEXT",
        "ALTER TABLE request_rows ADD COLUMN estimated_input_tokens BIGINT",
        "ALTER TABLE request_rows ADD COLUMN output_budget BIGINT",
    )),
    (8, (  # shadow policies against the live ones, rolled up every few seconds (#31)
        """CREATE TABLE shadow_rollups (
            at DOUBLE PRECISION NOT NULL, replica TEXT NOT NULL, group_name TEXT NOT NULL,
            policy_version TEXT NOT NULL, shadow_version TEXT NOT NULL,
            decisions BIGINT NOT NULL, agreements DOUBLE PRECISION NOT NULL,
            cost_delta_usd DOUBLE PRECISION NOT NULL,
            latency_delta_ms DOUBLE PRECISION NOT NULL,
            error_rate_delta DOUBLE PRECISION NOT NULL, dropped BIGINT NOT NULL)""",
        "CREATE INDEX shadow_rollups_at ON shadow_rollups (at)",
    )),
    (9, (  # where a request came from: rollout_check for `sidecar rollout check` (#42);
        #      the partial index holds the checklist's rows only (request_lookup.py)
        "ALTER TABLE request_rows ADD COLUMN origin TEXT",
        "CREATE INDEX request_rows_checklist ON request_rows (started_at) "
        "WHERE origin = 'rollout_check'",
    )),
    (10, (  # a group's canary (#42): which side decided each request, and its events
        "ALTER TABLE request_rows ADD COLUMN canary TEXT",
        """CREATE TABLE canary_events (
            at DOUBLE PRECISION NOT NULL, replica TEXT NOT NULL, group_name TEXT NOT NULL,
            policy_version TEXT NOT NULL, canary_version TEXT NOT NULL, event TEXT NOT NULL,
            guard TEXT NOT NULL, figure DOUBLE PRECISION NOT NULL,
            guard_limit DOUBLE PRECISION NOT NULL, requests BIGINT NOT NULL,
            errors BIGINT NOT NULL)""",
        "CREATE INDEX canary_events_at ON canary_events (at)",
    )),
    (11, (  # shadow traffic (#42): each mirrored request beside its live answer
        """CREATE TABLE shadow_requests (
            at DOUBLE PRECISION NOT NULL, replica TEXT NOT NULL, group_name TEXT NOT NULL,
            live_request_id TEXT NOT NULL, candidate TEXT NOT NULL, stream BOOLEAN NOT NULL,
            shadow_status INTEGER NOT NULL, shadow_error_class TEXT,
            shadow_latency_ms DOUBLE PRECISION, shadow_ttft_ms DOUBLE PRECISION,
            shadow_input_tokens BIGINT, shadow_output_tokens BIGINT,
            shadow_cost_usd DOUBLE PRECISION, shadow_finish TEXT, shadow_tools TEXT NOT NULL,
            shadow_tool_arguments_valid BOOLEAN, shadow_json_valid BOOLEAN,
            live_target TEXT, live_status INTEGER, live_error_class TEXT,
            live_latency_ms DOUBLE PRECISION, live_ttfb_ms DOUBLE PRECISION,
            live_input_tokens BIGINT, live_output_tokens BIGINT,
            live_cost_usd DOUBLE PRECISION, both_answered BOOLEAN NOT NULL,
            output_ratio DOUBLE PRECISION)""",
        "CREATE INDEX shadow_requests_at ON shadow_requests (at)",
    )),
    (12, (  # the live answer's finish and tools beside the candidate's (#42)
        "ALTER TABLE shadow_requests ADD COLUMN live_finish TEXT",
        "ALTER TABLE shadow_requests ADD COLUMN live_tools TEXT",
        "ALTER TABLE shadow_requests ADD COLUMN same_finish BOOLEAN",
        "ALTER TABLE shadow_requests ADD COLUMN same_tools BOOLEAN",
    )),
)
ROLLUP_TABLES = ("daily_usage", "daily_decisions", "daily_fallbacks")
# Advisory-lock keys (PostgreSQL): replicas migrate and roll up one at a time.
MIGRATION_LOCK = 0x5EDCA1E0
ROLLUP_LOCK = 0x5EDCA1E1
LATEST = MIGRATIONS[-1][0]

_RENAMED = {"group": "group_name", "join": "join_kind", "limit": "guard_limit"}
REQUEST_COLUMNS = ("replica", *(_RENAMED.get(f.name, f.name) for f in fields(RequestRow)))
FALLBACK_COLUMNS = ("replica", *(_RENAMED.get(f.name, f.name) for f in fields(FallbackRow)))
SHADOW_COLUMNS = ("replica", *(_RENAMED.get(f.name, f.name) for f in fields(ShadowRow)))
MIRROR_COLUMNS = ("replica", *(_RENAMED.get(f.name, f.name) for f in fields(MirrorRow)))
# The table's order: replica second, as in the CREATE TABLE.
CANARY_COLUMNS = ("at", "replica", *(_RENAMED.get(f.name, f.name)
                                     for f in fields(CanaryEventRow) if f.name != "at"))


# Reading the fields in column order: `dataclasses.astuple` deep-copies (33 µs a row).
_REQUEST_FIELDS = attrgetter(*(f.name for f in fields(RequestRow)))
_FALLBACK_FIELDS = attrgetter(*(f.name for f in fields(FallbackRow)))
_SHADOW_FIELDS = attrgetter(*(f.name for f in fields(ShadowRow)))
_MIRROR_FIELDS = attrgetter(*(f.name for f in fields(MirrorRow)))
_SHAPE = REQUEST_COLUMNS.index("request_shape")
_SCORES = REQUEST_COLUMNS.index("selected_scores")
_ODDS = REQUEST_COLUMNS.index("candidate_odds")


def request_values(replica: str, row: RequestRow) -> tuple[object, ...]:
    values = [replica, *_REQUEST_FIELDS(row)]
    values[_SHAPE] = json_text(row.request_shape)
    values[_SCORES] = json_text(row.selected_scores)
    values[_ODDS] = None if row.candidate_odds is None else json_text(row.candidate_odds)
    return tuple(values)


_JSON_MEMO: dict[tuple[object, ...], str] = {}


def json_text(mapping: object) -> str:
    """JSON of a small map of bucket names; the same few maps recur row after row, so their
    text is remembered (bounded: cleared past 4,096 distinct maps)."""
    key = tuple(mapping.items())  # type: ignore[attr-defined]
    text = _JSON_MEMO.get(key)
    if text is None:
        if len(_JSON_MEMO) >= 4096:
            _JSON_MEMO.clear()
        text = _JSON_MEMO[key] = json.dumps(dict(key), sort_keys=True)
    return text


def fallback_values(replica: str, row: FallbackRow) -> tuple[object, ...]:
    return (replica, *_FALLBACK_FIELDS(row))


def shadow_values(replica: str, row: ShadowRow) -> tuple[object, ...]:
    return (replica, *_SHADOW_FIELDS(row))


def mirror_values(replica: str, row: MirrorRow) -> tuple[object, ...]:
    return (replica, *_MIRROR_FIELDS(row))


def canary_values(replica: str, row: CanaryEventRow) -> tuple[object, ...]:
    return (row.at, replica, row.group, row.policy_version, row.canary_version, row.event,
            row.guard, row.figure, row.limit, row.requests, row.errors)


def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    """With `{p}` placeholders (database.sql fills them in)."""
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join(['{p}'] * len(columns))})")
