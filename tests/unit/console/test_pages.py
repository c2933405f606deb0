"""The console's pages as the admin endpoint serves them (console/app.py): every page on
loopback, the security headers, markup that the content-security policy allows (no inline
style or script), hostile names escaped, the token rule with its login, and the usage
page's figures and CSV equal to the usage report's."""

from __future__ import annotations

import asyncio
import time
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

from sidecar.commands.report import csv_text, filters_for, report_document
from sidecar.config.service_settings import Telemetry
from sidecar.console.app import Console, ConsoleSources
from sidecar.console.decision_ring import DecisionRing
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.operations.admin import AdminServer
from sidecar.routing.router import Router
from sidecar.telemetry.database import SQLiteDatabase
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import FallbackRow, request_row
from sidecar.telemetry.store import TelemetryStore
from tests.unit.routing.helpers import config, request

TOKEN = "admin-token-0123456789-0123456789-abc"
HOSTILE = '<img src=x onerror="alert(1)">'
GROUP = f"""
  g:
    strategy: dynamic_score
    targets:
      - {{provider: p, model_ref: 'a{HOSTILE}', weight: 3,
         pricing: {{input_per_mtok: 1, output_per_mtok: 2}}}}
      - {{provider: q, model_ref: b, weight: 1}}
"""


def telemetry(tmp_path: Path) -> Telemetry:
    path = tmp_path / "t.db"
    store = TelemetryStore(SQLiteDatabase(path))
    now = time.time()
    store.write([request_row(None, RequestResult(f"r{n}", 200 if n % 4 else 503,
                                                 "p/a" if n % 2 else "q/b", 1,
                                                 "ok" if n % 4 else "server_error",
                                                 100.0 * n, 10.0, 10, 5, 0), {}, "log_only",
                             now - 60 * n) for n in range(1, 9)],
                [FallbackRow("r1", now - 60, "", "g", "p/a", 1, "timeout")])
    store.close()
    return Telemetry(sqlite_path=path)


def sidecar_parts(tmp_path: Path, token: str | None) -> AdminServer:
    cfg = config(GROUP)
    router = Router(cfg)
    store = ObservationStore()
    ring = DecisionRing()
    for n in range(30):
        decision = router.decide(request(), store)
        ring.decided(f"req-{n}", time.time(), "team", decision)
        label = decision.primary.label
        store.record(Observation(target=label, outcome=Outcome.OK, latency_ms=50.0 + n))
        ring.finished(RequestResult(f"req-{n}", 200, label, 1, "ok", 50.0 + n, 5.0))
    server = AdminServer(store, "127.0.0.1", 0, token=token)
    replays = tmp_path / "replays"
    replays.mkdir(exist_ok=True)
    (replays / f"{HOSTILE}.json").write_text("[]")
    server.console = Console(ConsoleSources(lambda: SimpleNamespace(config=cfg, router=router),
                                            store, ring, None, None, telemetry(tmp_path),
                                            replays), token)
    return server


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        self.inline += [f"{tag} {name}" for name in names
                        if name == "style" or name.startswith("on")]
        if tag in ("script", "style") and "src" not in names:
            self.inline.append(tag)
        if tag in ("img", "iframe", "object", "embed"):
            self.inline.append(tag)


def inline_markup(text: str) -> list[str]:
    """Elements and attributes the console's content-security policy would block, or that
    no console page has: inline styles and handlers, inline scripts, embedded content."""
    parser = _Markup()
    parser.feed(text)
    return parser.inline


async def get(server: AdminServer, path: str, headers: str = "", method: str = "GET",
              body: bytes = b"") -> tuple[int, dict[str, str], str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    length = f"content-length: {len(body)}\r\n" if method == "POST" else ""
    host = "" if "host:" in headers else "host: 127.0.0.1\r\n"
    writer.write(f"{method} {path} HTTP/1.1\r\n{host}{headers}{length}\r\n".encode() + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.lower()] = value.strip()
    return int(lines[0].split(" ")[1]), fields, payload.decode()


PAGES = ("/console/now", "/console/decisions", "/console/decisions?outcome=served&caller=team",
         "/console/decisions/req-3", "/console/usage?period=24h", "/console/errors?period=24h",
         "/console/usage.csv?view=caller&period=24h", "/console/login")


def run(tmp_path: Path, token: str | None, check) -> None:
    async def go() -> None:
        server = sidecar_parts(tmp_path, token)
        await server.start()
        try:
            await check(server)
        finally:
            await server.stop()
    asyncio.run(go())


def test_every_page_on_loopback_is_safe_markup_with_strict_headers(tmp_path: Path) -> None:
    async def check(server: AdminServer) -> None:
        for path in PAGES:
            status, headers, text = await get(server, path)
            if path.endswith("/login"):
                assert status == 303 and headers["location"] == "/console/now"
                continue
            assert status == 200, (path, text[:300])
            csp = headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp
            assert "unsafe-inline" not in csp and headers["x-content-type-options"] == "nosniff"
            assert headers["cache-control"] == "no-store"
            assert HOSTILE not in text and "<img" not in text, path
            assert inline_markup(text) == [], path  # nothing the policy would block
        _, _, now = await get(server, "/console/now")
        assert "&lt;img src=x onerror=" in now and "Why traffic goes where it goes" in now
        assert "<svg" in now and "30 decisions in the last 60 s" in now
        status, _, _ = await get(server, "/console/decisions/nope")
        assert status == 404
        for static in ("console.css", "console.js"):
            status, headers, _ = await get(server, f"/console/static/{static}")
            assert status == 200 and headers["content-security-policy"]
        assert (await get(server, "/console/static/../admin.py"))[0] == 404
        assert (await get(server, "/console/now", method="POST"))[0] == 405
        many = "&".join(f"k{n}=1" for n in range(20))
        assert (await get(server, f"/console/decisions?{many}"))[0] == 400
        # Without a token, only a loopback name as Host: not a rebound name of another site.
        for host in ("evil.example", "evil.example:50052", "10.0.0.1"):
            assert (await get(server, "/console/now", f"host: {host}\r\n"))[0] == 421, host
        for host in ("localhost:50052", "[::1]:50052", "127.0.0.1"):
            assert (await get(server, "/console/now", f"host: {host}\r\n"))[0] == 200, host
    run(tmp_path, None, check)


def test_a_request_id_of_any_shape_links_to_its_own_decision(tmp_path: Path) -> None:
    """Envoy keeps a caller's own `x-request-id`: `/`, `?`, `%` or `..` in it must not
    make its link point anywhere else."""
    async def check(server: AdminServer) -> None:
        ring = server.console._sources.ring
        cfg = config(GROUP)
        odd = "../../observations?x=%41/b"
        ring.decided(odd, time.time(), "team", Router(cfg).decide(request()))
        _, _, page = await get(server, "/console/decisions")
        quoted = "/console/decisions/" + quote(odd, safe="")
        assert f'href="{quoted}"' in page and "/../" not in quoted  # one segment
        status, _, detail = await get(server, quoted)
        assert status == 200 and "&lt;" not in detail.split("request id")[0]
    run(tmp_path, None, check)


def test_the_usage_page_and_its_csv_are_the_usage_report(tmp_path: Path) -> None:
    async def check(server: AdminServer) -> None:
        _, _, page = await get(server, "/console/usage?period=24h")
        _, headers, csv = await get(server, "/console/usage.csv?view=target&period=24h")
        assert headers["content-type"].startswith("text/csv")
        db = SQLiteDatabase(tmp_path / "t.db", read_only=True)
        db.open()
        document = report_document(db, "usage", filters_for("24h", None, None, None,
                                                            time.time()), "target")
        db.close()
        assert csv.strip() == csv_text(document["rows"]).strip()
        for row in document["rows"]:
            assert f"<th scope=\"row\">{row['target']}</th><td class=\"num\">" \
                   f"{row['requests']}</td>" in page
        assert "server_error 2" in page  # the error classes
        _, _, errors = await get(server, "/console/errors?period=24h")
        assert "timeout" in errors and "<polyline" in errors
        assert "Replay reports" in errors and "not a `sidecar replay" in errors
    run(tmp_path, None, check)


def test_beyond_loopback_the_token_or_its_login_cookie(tmp_path: Path) -> None:
    async def check(server: AdminServer) -> None:
        status, headers, _ = await get(server, "/console/now")
        assert status == 303 and headers["location"] == "/console/login"
        status, _, form = await get(server, "/console/login")
        assert status == 200 and 'type="password"' in form and 'method="post"' in form
        assert (await get(server, "/console/now", f"authorization: Bearer {TOKEN}\r\n"))[0] == 200
        status, _, text = await get(server, "/console/login", method="POST", body=b"token=no")
        assert status == 401 and "not the admin token" in text
        status, headers, _ = await get(server, "/console/login", method="POST",
                                       body=f"token={TOKEN}".encode())
        assert status == 303 and TOKEN not in headers["set-cookie"]
        cookie = headers["set-cookie"].split(";")[0]
        for path in PAGES[:-1]:
            assert (await get(server, path, f"cookie: {cookie}\r\n"))[0] in (200,), path
        assert (await get(server, "/console/now", "cookie: sidecar_console=1.ab\r\n"))[0] == 303
        # The other admin paths keep their bearer rule: a console cookie is not the token.
        assert (await get(server, "/observations", f"cookie: {cookie}\r\n"))[0] == 401
        status, _, _ = await get(server, "/console/login", method="POST", body=b"x" * 5000)
        assert status == 413
    run(tmp_path, TOKEN, check)
