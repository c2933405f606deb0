"""The operator console (docs/console.md): read-only pages under `/console/` on the admin
endpoint.

What runs where: the event loop only copies references the router, the observation store,
the decision ring and the quota counters hold now (as `/observations` and `/metrics` do);
formatting a page runs on a worker thread, and so do telemetry reads, one at a time on a
read-only connection of their own, each bounded (console/telemetry_views.py). A telemetry
page's figures (or its failure) are kept `REUSE_SECONDS`, so several browsers refreshing
cost one read, and a read that hit its bound is not started again at every refresh.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from sidecar.config.service_settings import Telemetry
from sidecar.console import decisions_page, errors_page, now_page, usage_page
from sidecar.console.decision_ring import DecisionRing
from sidecar.console.html import esc, layout
from sidecar.console.login import ConsoleLogin
from sidecar.console.replay_reports import read_reports
from sidecar.console.responses import Page, redirect, text_page
from sidecar.console.telemetry_views import USAGE_VIEWS, Period, errors, usage
from sidecar.observe.store import ObservationStore
from sidecar.quotas.admission import Quotas
from sidecar.telemetry.database import Database, open_database
from sidecar.telemetry.reports import ReportTooLong

# The telemetry pages refresh every TELEMETRY_REFRESH_S, and what they read is reused a
# little less long: one read per refresh of an open tab, one for many tabs.
TELEMETRY_REFRESH_S = 30
REUSE_SECONDS = 25.0
REUSED_ENTRIES = 16
STATIC = {"console.css": "text/css; charset=utf-8",
          "console.js": "text/javascript; charset=utf-8"}
PAGE_NAMES = ("now", "decisions", "usage", "errors")


@dataclass
class ConsoleSources:
    """Where the pages read from (each read through the gateway's current runtime: a reload
    replaces it)."""

    runtime: Callable[[], Any]            # gateway.runtime: .config, .router
    store: ObservationStore
    ring: DecisionRing
    quotas: Quotas | None
    fleet: Callable[[], dict[str, float]] | None
    telemetry: Telemetry | None
    # Where `sidecar replay --format json` reports are written (--replay-reports), if any.
    replay_reports: Path | None = None


class Console:
    def __init__(self, sources: ConsoleSources, token: str | None, port: int = 0,
                 wall_clock: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sources = sources
        self.login = None if token is None else ConsoleLogin(token, port, wall_clock)
        self._clock = wall_clock
        self._monotonic = clock
        self._reading = asyncio.Lock()
        self._reused: OrderedDict[tuple[str, ...], tuple[float, tuple[Any, str | None]]] = (
            OrderedDict())
        self._static = {name: resources.files("sidecar.console").joinpath("static", name)
                        .read_bytes() for name in STATIC}
        self.pages_served = 0

    async def answer(self, method: str, path: str, query: str, admitted: bool,
                     cookie: bytes | None, form: bytes | None, peer: str = "") -> Page:
        """`admitted`: the request carried the admin token, or none is needed (loopback).
        `path` as sent (still quoted): a decision's id is unquoted once, whole."""
        name = path.removeprefix("/console").lstrip("/")
        if name.startswith("static/"):
            kind = STATIC.get(name.removeprefix("static/"))
            if kind is None or method != "GET":
                return text_page("404 Not Found", "no such file")
            return Page("200 OK", self._static[name.removeprefix("static/")], kind)
        if name == "login":
            return self._login(method, form, peer)
        if method != "GET":
            return text_page("405 Method Not Allowed", "the console is read-only")
        if not admitted and not (self.login is not None and self.login.admits(cookie)):
            return redirect("/console/login")
        if name == "":
            return redirect("/console/now")
        self.pages_served += 1
        try:
            values = parse_qs(query, max_num_fields=16)
        except ValueError:
            return text_page("400 Bad Request", "at most 16 query parameters")
        name = name if name.startswith("decisions/") else name.rstrip("/")
        if name == "now":
            return await self._now()
        if name == "decisions":
            return await self._decisions(values)
        if name.startswith("decisions/"):
            return await self._decision(unquote(name.removeprefix("decisions/")))
        if name in ("usage", "errors", "usage.csv"):
            return await self._telemetry_page(name, values)
        return text_page("404 Not Found", "no such console page; try /console/now")

    def _login(self, method: str, form: bytes | None, peer: str) -> Page:
        if self.login is None:  # on loopback without a token there is nothing to log in to
            return redirect("/console/now")
        if method == "POST":
            cookie = self.login.attempt(form or b"", peer)
            if cookie is not None:
                return redirect("/console/now", ("set-cookie", cookie))
            locked = self.login.locked(peer)
            return self._page("429 Too Many Requests" if locked else "401 Unauthorized",
                              "login", "Log in", _login_form(
                                  "too many failed logins from this address: wait a minute"
                                  if locked else "that is not the admin token"), refresh=0)
        return self._page("200 OK", "login", "Log in", _login_form(None), refresh=0)

    def _page(self, status: str, page: str, title: str, main: str, refresh: int = 5) -> Page:
        return Page(status, layout(page, title, main, self._clock(), refresh).encode())

    async def _now(self) -> Page:
        runtime = self._sources.runtime()
        fleet = self._sources.fleet() if self._sources.fleet is not None else None
        state = now_page.gather(runtime.config, runtime.router, self._sources.store,
                                self._sources.ring.recent(), self._clock(), fleet)
        main = await asyncio.to_thread(now_page.render, state)
        return self._page("200 OK", "now", "Now", main)

    async def _decisions(self, values: dict[str, list[str]]) -> Page:
        recent = self._sources.ring.recent()
        filters = decisions_page.DecisionFilters.from_query(values)
        main = await asyncio.to_thread(decisions_page.render_list, recent, filters, len(recent))
        return self._page("200 OK", "decisions", "Decisions", main)

    async def _decision(self, request_id: str) -> Page:
        entry = self._sources.ring.get(request_id)
        main = await asyncio.to_thread(decisions_page.render_detail, entry, request_id)
        return self._page("200 OK" if entry else "404 Not Found", "decisions", "Decision", main,
                          refresh=0)

    async def _telemetry_page(self, name: str, values: dict[str, list[str]]) -> Page:
        runtime = self._sources.runtime()
        groups = sorted(runtime.config.models)
        callers = sorted(c.name for c in runtime.config.callers)

        def one(key: str, allowed: list[str] | None = None) -> str | None:
            given = (values.get(key) or [""])[0]
            return given if given and (allowed is None or given in allowed) else None

        period = Period.of(one("period"), one("group", groups), one("caller", callers),
                           self._clock())
        quotas = (usage_page.quota_rows(self._sources.quotas.counters, groups)
                  if self._sources.quotas is not None and name == "usage" else [])
        read = usage if name in ("usage", "usage.csv") else errors
        found, problem = await self._read(name.removesuffix(".csv"), period, read)
        if name == "usage.csv":
            view = one("view", list(USAGE_VIEWS)) or "target"
            if found is None:
                return text_page("503 Service Unavailable", problem or "no telemetry")
            return Page("200 OK", usage_page.usage_csv(found[view]), "text/csv; charset=utf-8",
                        (("content-disposition",
                          f'attachment; filename="usage-by-{view}-{period.name}.csv"'),))
        if name == "usage":
            main = await asyncio.to_thread(usage_page.render, period, found, problem, quotas,
                                           groups, callers)
            return self._page("200 OK", "usage", "Usage and cost", main, TELEMETRY_REFRESH_S)
        replays = await asyncio.to_thread(read_reports, self._sources.replay_reports)
        main = await asyncio.to_thread(errors_page.render, period, found, problem, groups,
                                       callers, replays)
        return self._page("200 OK", "errors", "Fallbacks and errors", main,
                          TELEMETRY_REFRESH_S)

    async def _read(self, page: str, period: Period,
                    read: Callable[[Database, Period], Any]) -> tuple[Any, str | None]:
        settings = self._sources.telemetry
        if settings is None:
            return None, ("telemetry is off: set telemetry.sqlite_path or postgres_dsn to see "
                          "usage, cost and errors over time")
        key = (page, period.name, period.filters.group or "", period.filters.caller or "")
        async with self._reading:  # one database read at a time
            reused = self._reused.get(key)
            if reused is not None and self._monotonic() - reused[0] < REUSE_SECONDS:
                return reused[1]
            try:
                found: tuple[Any, str | None] = (
                    await asyncio.to_thread(_read_only, settings, read, period), None)
            except ReportTooLong as exc:
                found = (None, f"this period holds too many rows to read here ({exc}): "
                               "choose a shorter period, or run `sidecar report`")
            except Exception as exc:  # the database is away: say so, never its DSN
                found = (None, f"the telemetry read failed ({type(exc).__name__})")
            # A failure is kept as long as an answer: a refreshing tab must not start a
            # long read again and again.
            self._reused[key] = (self._monotonic(), found)
            self._reused.move_to_end(key)
            while len(self._reused) > REUSED_ENTRIES:
                self._reused.popitem(last=False)
            return found


def _read_only(settings: Telemetry, read: Callable[[Database, Period], Any],
               period: Period) -> Any:
    db = open_database(settings, read_only=True)
    try:
        db.open()
        return read(db, period)
    finally:
        db.close()


def _login_form(problem: str | None) -> str:
    message = f'<p class="problem" role="alert">{esc(problem)}</p>' if problem else ""
    return ("<h1>Log in to the console</h1>"
            '<p class="note">This admin endpoint is reachable beyond this host: give its '
            "admin token (the file passed with --admin-token-file). It is checked once; the "
            "browser keeps a signed session cookie, never the token.</p>" + message
            + '<form class="login" method="post" action="/console/login">'
            '<label for="token">admin token</label>'
            '<input id="token" name="token" type="password" autocomplete="current-password" '
            'required autofocus><button type="submit">log in</button></form>')
