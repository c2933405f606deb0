"""`GET /reports/<usage|decisions|fallbacks>?since=24h&until=&group=&caller=&by=` on the
admin endpoint: the JSON `sidecar report --format json` prints (docs/telemetry.md §6); and
`GET /requests?trace=<trace id>`: the rows of one trace's requests (`sidecar rollout
check` reads what the gateway did with what it sent).

A report reads the database, so it runs on a worker thread with a read-only connection of
its own, never on the event loop; one report runs at a time (a second gets 429), so a peer
cannot stack up database scans. Query values are checked before anything is read: a bad
one is a 400 that names it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qs

from sidecar.commands.report import filters_for, report_document
from sidecar.config.service_settings import Telemetry
from sidecar.telemetry.canary_report import recorded_withdrawals
from sidecar.telemetry.database import Database, open_database
from sidecar.telemetry.reports import BY, KINDS
from sidecar.telemetry.request_lookup import rows_of_trace, valid_trace_id

MAX_VALUE_CHARS = 256
T = TypeVar("T")
_KEYS = {"since", "until", "group", "caller", "by"}


class AdminReports:
    def __init__(self, settings: Telemetry) -> None:
        self._settings = settings
        self._running = asyncio.Lock()
        # The checklist's lookups have their own slot: a report does not hold them up, and
        # a check polling for its rows does not hold reports up.
        self._looking_up = asyncio.Lock()

    async def answer(self, kind: str, query: str) -> tuple[str, object]:
        if kind not in KINDS:
            return "404 Not Found", {"error": f"reports: one of {', '.join(KINDS)}"}
        values = parse_qs(query, keep_blank_values=True)
        unknown = sorted(set(values) - _KEYS)
        if unknown:
            return "400 Bad Request", {"error": f"unknown parameter {unknown[0][:40]!r}; "
                                                f"use {', '.join(sorted(_KEYS))}"}
        args: dict[str, str | None] = {}
        for key in _KEYS:
            given = values.get(key)
            if given and (len(given) > 1 or len(given[0]) > MAX_VALUE_CHARS):
                return "400 Bad Request", {"error": f"{key}: one value of at most "
                                                    f"{MAX_VALUE_CHARS} characters"}
            args[key] = given[0] if given else None
        by = args["by"] or "target"
        if by not in BY:
            return "400 Bad Request", {"error": f"by: one of {', '.join(BY)}"}
        try:
            filters = filters_for(args["since"] or "24h", args["until"], args["group"],
                                  args["caller"], time.time())
        except ValueError as exc:
            return "400 Bad Request", {"error": str(exc).replace("--", "")}
        if self._running.locked():
            return "429 Too Many Requests", {"error": "a report is already running"}
        async with self._running:
            try:
                document = await asyncio.to_thread(
                    self._read_only,
                    lambda db: report_document(db, kind, filters, by))
            except Exception as exc:  # the database is away: say so, never its DSN
                return "503 Service Unavailable", {
                    "error": f"telemetry database unavailable ({type(exc).__name__})"}
        return "200 OK", document

    async def requests(self, query: str) -> tuple[str, object]:
        """`GET /requests?trace=<32 hex digits>[&since=SECONDS]`: the rows of one trace's
        requests (request_lookup.py), for `sidecar rollout check`."""
        values = parse_qs(query, keep_blank_values=True)
        unknown = sorted(set(values) - {"trace", "since"})
        if unknown:
            return "400 Bad Request", {"error": f"unknown parameter {unknown[0][:40]!r}; "
                                                "use trace, since"}
        trace = values.get("trace", [""])
        since = values.get("since", ["900"])
        if len(trace) != 1 or not valid_trace_id(trace[0]):
            return "400 Bad Request", {"error": "trace: one W3C trace id (32 lowercase "
                                                "hexadecimal digits, not all zero)"}
        if len(since) != 1 or not (since[0].isascii() and since[0].isdigit()
                                   and 0 < len(since[0]) <= 5 and int(since[0]) > 0):
            return "400 Bad Request", {"error": "since: seconds, a positive integer"}
        if self._looking_up.locked():
            return "429 Too Many Requests", {"error": "a lookup is already running"}
        async with self._looking_up:
            try:
                rows = await asyncio.to_thread(
                    self._read_only, lambda db: rows_of_trace(db, trace[0], int(since[0])))
            except Exception as exc:
                return "503 Service Unavailable", {
                    "error": f"telemetry database unavailable ({type(exc).__name__})"}
        return "200 OK", {"trace": trace[0], "rows": rows}

    async def withdrawn_canaries(self, candidates: dict[str, str]) -> set[tuple[str, str]]:
        """The candidates (group → version) the database records as withdrawn
        (rollout/canary_guard.py reads this every few seconds while a canary serves)."""
        return await asyncio.to_thread(
            self._read_only, lambda db: recorded_withdrawals(db, candidates))

    def _read_only(self, read: Callable[[Database], T]) -> T:
        """`read` on a read-only connection of its own (run on a worker thread)."""
        db = open_database(self._settings, read_only=True)
        try:
            db.open()
            return read(db)
        finally:
            db.close()
