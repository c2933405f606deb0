"""The sidecar's admin HTTP endpoint (loopback by default): a read-only window on its state.

- `GET /observations[?window=SECONDS]`: every target's window figures, in the snapshot
  format `sidecar explain --observations` reads, plus the outcome counts.
- `GET /healthz`: `ok`.
- `POST /reload`: reload the configuration file (operations/reload.py); needs the admin
  token even on loopback. 200 with the outcome, or 422 with the problems (the running
  configuration stays).
- `GET /metrics`: Prometheus exposition (telemetry/metrics.py).
- `GET /reports/<usage|decisions|fallbacks>?since=24h&...`: telemetry reports as JSON
  (telemetry/admin_reports.py), when telemetry is on.
- `GET /requests?trace=<trace id>[&since=SECONDS]`: the telemetry rows of the requests
  sent with that W3C trace id (at most 50, from the last hour at most), for `sidecar
  rollout check` (telemetry/request_lookup.py).
- `GET /console/`: the operator console (console/app.py, docs/console.md): read-only
  pages for browsers; beyond loopback a login form takes the admin token once.
- `GET /status`: ext_proc streams being served and asyncio tasks alive (both return to
  their idle level when requests end, cancelled ones included), and the gRPC port's
  counters (connections, refusals, protocol errors, unauthenticated calls, bytes held).

A deliberately tiny HTTP/1.1 server on asyncio: no dependencies, one request per connection,
GET only (and `POST /reload`), nothing secret in any answer. Loopback by default; bound to
any other address it needs an admin token (`--admin-token-file`), which every request but
`/healthz` must send as `authorization: Bearer <token>` (compared in constant time);
starting on a non-loopback
address without one is refused. What one peer can cost is bounded: at most
`MAX_CONNECTIONS` connections at once, `HEAD_TIMEOUT` (2 s) to send a request head of at
most 64 KiB and 100 header lines. Beyond the limit, `HEALTHZ_SPARE` more connections may
still ask for `/healthz` alone (`HEALTHZ_HEAD_TIMEOUT`, 0.5 s, for their head), so slow
peers holding every slot do not make a liveness probe fail; anything else is closed
unanswered and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

from sidecar.console.app import Console
from sidecar.console.login import MAX_FORM_BYTES
from sidecar.console.responses import Page, text_page
from sidecar.observe.store import ObservationStore
from sidecar.telemetry.admin_reports import AdminReports
from sidecar.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sidecar.telemetry.metrics import Metrics


def observations_document(store: ObservationStore, window_seconds: int) -> dict[str, object]:
    """Windows longer than the store's retention are answered (and labelled) as retention."""
    window = max(1, min(window_seconds, store.retention_seconds))
    targets: dict[str, object] = {}
    for target in store.targets():
        summary = store.summary(target, window)
        targets[target] = {**asdict(summary.figures), "outcomes": summary.outcomes}
    return {"window_seconds": window, "targets": targets}


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to serve the admin endpoint beyond loopback without a token."""
    if token is None and not is_loopback(host):
        raise ValueError(f"the admin endpoint on {host} is reachable beyond this host: "
                         "give it a token with --admin-token-file, or bind it to 127.0.0.1")


def _loopback_host(host_header: bytes) -> bool:
    """A Host header naming a loopback address (any port), as a browser on this host
    sends it."""
    host = host_header.decode("latin-1").strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    else:
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MAX_CONNECTIONS = 64
_KEPT_HEADERS = (b"authorization", b"cookie", b"content-length", b"host")
HEAD_TIMEOUT = 2.0
HEALTHZ_SPARE = 8
HEALTHZ_HEAD_TIMEOUT = 0.5


class StreamCounter(Protocol):
    active_streams: int

    @property
    def retry_credentials_received(self) -> int: ...


class AdminServer:
    def __init__(self, store: ObservationStore, host: str, port: int,
                 streams: StreamCounter | None = None,
                 grpc_counters: Callable[[], dict[str, int]] | None = None,
                 metrics: Metrics | None = None, token: str | None = None,
                 reports: AdminReports | None = None) -> None:
        # The operator console (console/app.py), served under /console/ when set.
        self.console: Console | None = None
        # `POST /reload` (operations/reload.py): set once the sidecar is running.
        self.reload: Callable[[], Awaitable[dict[str, object]]] | None = None
        check_exposure(host, token)
        self._store = store
        self._token = None if token is None else f"Bearer {token}".encode()
        self._reports = reports
        self._metrics = metrics
        self._streams = streams
        self._grpc_counters = grpc_counters
        self._open = 0
        self._spare = 0
        self.connections_refused = 0
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            if self._spare >= HEALTHZ_SPARE:
                self.connections_refused += 1
                writer.transport.abort()
                return
            await self._healthz_only(reader, writer)
            return
        self._open += 1
        try:
            line, head = await asyncio.wait_for(self._read_head(reader), HEAD_TIMEOUT)
            try:
                if line.split(b" ")[1:2] and line.split(b" ")[1].startswith(b"/console"):
                    peer = writer.get_extra_info("peername")
                    page = await self._console(line.decode("latin-1"), head, reader,
                                               str(peer[0]) if peer else "")
                    writer.write(page.head().encode() + page.body)
                    await writer.drain()
                    return
                status, body = await self._dispatch(line.decode("latin-1"),
                                                    head.get(b"authorization"))
            except (TimeoutError, asyncio.IncompleteReadError):
                raise
            except Exception:  # never let a request take the endpoint down
                status, body = "500 Internal Server Error", {"error": "internal error"}
            await self._answer(writer, status, body)
        except (TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass  # slow, oversized or broken requests are simply dropped
        finally:
            self._open -= 1
            writer.close()

    async def _healthz_only(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        """Every slot is taken: one of the few spare connections, for `/healthz` only."""
        self._spare += 1
        try:
            line, _ = await asyncio.wait_for(self._read_head(reader), HEALTHZ_HEAD_TIMEOUT)
            if line.split(b" ")[:2] == [b"GET", b"/healthz"]:
                await self._answer(writer, "200 OK", "ok")
            else:
                self.connections_refused += 1
        except (TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError):
            self.connections_refused += 1
        finally:
            self._spare -= 1
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: str, body: object) -> None:
        content_type = "application/json"
        if isinstance(body, bytes):  # the Prometheus exposition
            payload, content_type = body, METRICS_CONTENT_TYPE
        else:
            payload = json.dumps(body).encode()
        writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
                     f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
                     .encode() + payload)
        await writer.drain()

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
        """The request line and the headers this endpoint reads (`authorization`, and the
        console's `cookie` and `content-length`); others are read and ignored (at most 100
        header lines in all)."""
        line = await reader.readline()
        kept: dict[bytes, bytes] = {}
        for _ in range(100):
            header = await reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name in _KEPT_HEADERS:
                kept[name] = value.strip()
        return line, kept

    async def _console(self, request_line: str, head: dict[bytes, bytes],
                       reader: asyncio.StreamReader, peer: str) -> Page:
        """`/console/…` (console/app.py): the bearer token, or the console's login cookie
        beyond loopback; a login form's body (at most MAX_FORM_BYTES) read within the
        head's time."""
        parts = request_line.split(" ")
        if self.console is None:
            return text_page("404 Not Found", "the console is not served by this process")
        method, url = parts[0], urlsplit(parts[1])
        if self._token is None and not _loopback_host(head.get(b"host", b"")):
            # Without a token only loopback is served; a page of another site whose name
            # was re-pointed at 127.0.0.1 (DNS rebinding) sends its own name as Host.
            return text_page("421 Misdirected Request", "this console answers only to a "
                             "loopback address (127.0.0.1, [::1], localhost) without a token")
        authorization = head.get(b"authorization")
        admitted = self._token is None or (
            authorization is not None and hmac.compare_digest(authorization, self._token))
        form = None
        if method == "POST":
            length = head.get(b"content-length", b"0")
            if not (length.isdigit() and int(length) <= MAX_FORM_BYTES):
                return text_page("413 Content Too Large", "a login form is a few bytes")
            form = await asyncio.wait_for(reader.readexactly(int(length)), HEAD_TIMEOUT)
        return await self.console.answer(method, url.path, url.query, admitted,
                                         head.get(b"cookie"), form, peer)

    async def _dispatch(self, request_line: str,
                        authorization: bytes | None) -> tuple[str, object]:
        parts = request_line.split(" ")
        if len(parts) >= 2 and parts[0] == "POST" and parts[1] == "/reload":
            return await self._reload(authorization)
        if len(parts) < 2 or parts[0] != "GET":
            return "405 Method Not Allowed", {"error": "only GET is served (and POST /reload)"}
        url = urlsplit(parts[1])
        if url.path == "/healthz":
            return "200 OK", "ok"
        if self._token is not None and not (
                authorization is not None and hmac.compare_digest(authorization, self._token)):
            return "401 Unauthorized", {"error": "send the admin token: "
                                                 "authorization: Bearer <token>"}
        if url.path.startswith("/reports/") or url.path == "/requests":
            if self._reports is None:
                return "404 Not Found", {"error": "telemetry is off: no reports (set "
                                                  "telemetry.sqlite_path or postgres_dsn)"}
            if url.path == "/requests":
                return await self._reports.requests(url.query)
            return await self._reports.answer(url.path.removeprefix("/reports/"), url.query)
        return self._route(url.path, url.query)

    async def _reload(self, authorization: bytes | None) -> tuple[str, object]:
        """Reloading changes what the sidecar does: only with an admin token, even on
        loopback (any local process can reach loopback)."""
        if self._token is None:
            return "403 Forbidden", {"error": "POST /reload needs an admin token "
                                              "(--admin-token-file); or send SIGHUP"}
        if authorization is None or not hmac.compare_digest(authorization, self._token):
            return "401 Unauthorized", {"error": "send the admin token: "
                                                 "authorization: Bearer <token>"}
        if self.reload is None:
            return "503 Service Unavailable", {"error": "not running yet"}
        result = await self.reload()
        return ("200 OK" if result["ok"] else "422 Unprocessable Entity"), result

    def _route(self, path: str, query: str) -> tuple[str, object]:
        if path == "/status":
            streams = self._streams.active_streams if self._streams else 0
            grpc = self._grpc_counters() if self._grpc_counters else {}
            leaked = self._streams.retry_credentials_received if self._streams else 0
            return "200 OK", {"ext_proc_streams": streams,
                              "retry_credentials_received": leaked,
                              "asyncio_tasks": len(asyncio.all_tasks()),
                              "grpc": grpc,
                              "admin_connections_refused": self.connections_refused}
        if path == "/metrics" and self._metrics is not None:
            return "200 OK", self._metrics.exposition()
        if path == "/observations":
            window = self._store.retention_seconds
            values = parse_qs(query).get("window")
            if values:
                text = values[0]
                if not (text.isascii() and text.isdigit() and 0 < len(text) <= 9
                        and int(text) > 0):
                    return "400 Bad Request", {"error": "window must be a positive integer"}
                window = int(text)
            return "200 OK", observations_document(self._store, window)
        return "404 Not Found", {"error": "try /console/, /observations, /metrics, "
                                          "/reports/usage, /status or /healthz"}
