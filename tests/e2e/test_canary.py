"""Canary: unique secrets sent through the real stack (a prompt, the caller token, a
provider key, a caller header, a cookie) and then looked for everywhere an operator or an
attacker could read: the sidecar's log at debug level (Envoy's stderr shares it, at its
default level), the decision log, every admin endpoint of the sidecar, Envoy admin's
`/config_dump`, `/stats` and `/clusters`, every error body, the telemetry reports, and every
table and column of the telemetry database (raw rows, then daily rollups), on SQLite and on
PostgreSQL. Only the provider may see its own key, and it must see none of the caller's
secrets."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import Behaviour, FakeProvider
from sidecar.telemetry.database import Database, SQLiteDatabase
from sidecar.telemetry.store import TelemetryStore
from tests.postgres_server import fresh_database

pytestmark = pytest.mark.e2e

RUN = uuid.uuid4().hex[:12]
PROMPT = f"CANARY-PROMPT-{RUN}"
CALLER_TOKEN = f"canary-caller-token-{RUN}"
PROVIDER_KEY = f"canary-provider-key-{RUN}"
SECOND_KEY = f"canary-second-key-{RUN}"
HEADER = f"CANARY-HEADER-{RUN}"
COOKIE = f"CANARY-COOKIE-{RUN}"
IMAGE = f"CANARY-IMAGE-{RUN}"
TOOL_OUTPUT = f"CANARY-TOOL-OUTPUT-{RUN}"
ADMIN_TOKEN = f"canary-admin-token-{RUN}-{uuid.uuid4().hex}"
_PLAIN = (PROMPT, CALLER_TOKEN, HEADER, COOKIE, IMAGE, TOOL_OUTPUT)
CALLER_SECRETS = (*_PLAIN, *(hashlib.sha256(s.encode()).hexdigest() for s in _PLAIN))
EVERY_SECRET = (*CALLER_SECRETS, PROVIDER_KEY, SECOND_KEY, ADMIN_TOKEN,
                *(hashlib.sha256(s.encode()).hexdigest()
                  for s in (PROVIDER_KEY, SECOND_KEY, ADMIN_TOKEN)))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def run(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Start the stack, send the canaries through every kind of answer, and collect
    everything readable afterwards: {place: text}."""
    workdir = tmp_path_factory.mktemp("canary")
    with contextlib.ExitStack() as stack:
        if request.param == "postgres":
            dsn = stack.enter_context(fresh_database(
                request.getfixturevalue("postgres_admin_dsn")))
            telemetry, env = "{postgres_dsn: {env: TELEMETRY_DSN}}", {"TELEMETRY_DSN": dsn}
        else:
            dsn = None
            telemetry, env = f"{{sqlite_path: '{workdir / 'telemetry.db'}'}}", {}
        yield from _run(workdir, telemetry, env, dsn)


def _run(workdir: Path, telemetry: str, env: dict[str, str],
         dsn: str | None) -> Iterator[dict[str, str]]:
    fakes = [FakeProvider("canary", api_key=PROVIDER_KEY),
             FakeProvider("second", api_key=SECOND_KEY)]
    with ProviderThread(fakes) as providers:
        config = workdir / "config.yaml"
        key_file = workdir / "second.key"
        key_file.write_text(SECOND_KEY + "\n")
        config.write_text(f"""\
providers:
  canary: {{base_url: '{providers.base_url("canary")}', credential: {{env: CANARY_KEY}}}}
  second: {{base_url: '{providers.base_url("second")}', credential: {{file: {key_file}}}}}
callers: [{{name: canary-team, token_sha256: {hashlib.sha256(CALLER_TOKEN.encode()).hexdigest()}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {telemetry}
models:
  canary-group:
    strategy: failover
    targets:
      - {{provider: canary, model_ref: canary-model, tags: [vision, tool_capable]}}
      - {{provider: second, model_ref: second-model, tags: [vision, tool_capable]}}
""")
        log_path = workdir / "up.log"
        admin_token = workdir / "admin.token"
        admin_token.write_text(ADMIN_TOKEN + "\n")
        up = UpProcess(["--log-level", "debug", "--config", str(config), "--log-decisions",
                        "--admin-token-file", str(admin_token)],
                       env={"CANARY_KEY": PROVIDER_KEY, **env}, log_path=log_path)
        with up.running():
            places = _exercise(up, providers)
            time.sleep(1.0)  # the access log (50 ms) and the telemetry writer (250 ms)
            places |= _collect(up)
        database = _database(workdir, dsn)
        places["telemetry database, every table and column"] = _dump(database)
        # Roll everything up and expire it (as 40 days from now): the rollups, too.
        TelemetryStore(database, raw_retention_days=1).maintain(time.time() + 40 * 86_400)
        places["telemetry rollups, every table and column"] = _dump(database)
        database.close()
        places["sidecar and Envoy log (debug / warning)"] = log_path.read_text()
        places["provider canary received"] = _received(providers, "canary")
        places["provider second received"] = _received(providers, "second")
        yield places


def _database(workdir: Path, dsn: str | None) -> Database:
    if dsn is None:
        return SQLiteDatabase(workdir / "telemetry.db")
    from sidecar.telemetry.postgres import PostgresDatabase

    return PostgresDatabase(dsn)


def _dump(database: Database) -> str:
    with database.transaction() as cursor:
        if isinstance(database, SQLiteDatabase):
            cursor.execute("SELECT name FROM sqlite_master WHERE type='table'")
        else:
            cursor.execute("SELECT table_name FROM information_schema.tables "
                           "WHERE table_schema = 'public'")
        tables = [t for (t,) in cursor.fetchall()]
        text = [f"{table}: {row!r}" for table in tables
                for row in cursor.execute(f"SELECT * FROM {table}").fetchall()]
    assert len(text) > 5, "telemetry rows were written"
    return "\n".join(text)


def _received(providers: ProviderThread, name: str) -> str:
    return "\n".join(json.dumps({"headers": r.headers, "path": r.path})
                     for r in providers.provider(name).received)


def _exercise(up: UpProcess, providers: ProviderThread) -> dict[str, str]:
    """Every kind of answer, each carrying the canaries: a JSON completion, a stream, a
    fallback after a 503, a 401, a 404, a 400 and an all-attempts-failed 502."""
    url = f"{up.base_url}/v1/chat/completions"
    headers = {"authorization": f"Bearer {CALLER_TOKEN}", "x-canary": HEADER,
               "cookie": f"session={COOKIE}"}
    chat = {"model": "canary-group", "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": PROMPT},
            {"type": "image_url", "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(IMAGE.encode()).decode()}},
            {"type": "image_url", "image_url": {"url": f"https://example.com/{IMAGE}.png"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": TOOL_OUTPUT}]}
    bodies: dict[str, str] = {}
    with httpx.Client(timeout=10) as client:
        ok = client.post(url, headers=headers, json=chat)
        assert ok.status_code == 200, ok.text
        with client.stream("POST", url, headers=headers, json={**chat, "stream": True}) as stream:
            assert stream.status_code == 200
            stream.read()
        providers.provider("canary").behaviour = Behaviour(status=503)
        assert client.post(url, headers=headers, json=chat).status_code == 200  # fallback
        providers.provider("second").behaviour = Behaviour(status=500)
        failed = client.post(url, headers=headers, json=chat)
        assert failed.status_code == 502
        bodies["error 502 (every attempt failed)"] = failed.text
        providers.provider("canary").behaviour = Behaviour()
        providers.provider("second").behaviour = Behaviour()
        wrong_token = client.post(url, json=chat, headers={
            "authorization": f"Bearer {CALLER_TOKEN}-wrong", "x-canary": HEADER})
        assert wrong_token.status_code == 401
        bodies["error 401"] = wrong_token.text
        unknown = client.post(url, headers=headers, json={**chat, "model": f"nope-{RUN}"})
        assert unknown.status_code == 404
        bodies["error 404"] = unknown.text
        broken = client.post(url, headers=headers, content=b'{"model": "canary-group", ' +
                             PROMPT.encode())
        assert broken.status_code == 400
        bodies["error 400"] = broken.text
        anthropic = client.post(f"{up.base_url}/v1/messages", headers=headers,
                                json={**chat, "max_tokens": 5})
        bodies[f"answer {anthropic.status_code} on /v1/messages"] = anthropic.text
    return bodies


def _console(client: httpx.Client, admin: str) -> dict[str, str]:
    """Every page of the operator console (issue 43), each decision's explain view and every
    CSV, through its login: the token rule (a redirect to the login without it, a refusal
    of a wrong one, a cookie for the right one) and then the pages' text."""
    assert client.get(f"{admin}/console/now").status_code == 303
    assert client.post(f"{admin}/console/login", data={"token": "wrong"}).status_code == 401
    login = client.post(f"{admin}/console/login", data={"token": ADMIN_TOKEN})
    assert login.status_code == 303 and ADMIN_TOKEN not in login.headers["set-cookie"]
    cookie = {"cookie": login.headers["set-cookie"].split(";")[0]}
    places = {}
    paths = ["/console/now", "/console/decisions", "/console/decisions?caller=canary-team",
             "/console/usage?period=15m", "/console/errors?period=15m", "/console/login",
             *(f"/console/usage.csv?view={view}&period=15m"
               for view in ("target", "caller", "group", "complexity"))]
    decisions = client.get(f"{admin}/console/decisions", headers=cookie).text
    paths += sorted(set(re.findall(r'href="(/console/decisions/[^"?]+)"', decisions)))
    assert len(paths) > 12, "the decisions page links each decision"
    for path in paths:
        answer = client.get(f"{admin}{path}", headers=cookie)
        assert answer.status_code in (200, 303), (path, answer.status_code)
        places[f"console {path}"] = answer.text
    return places


def _collect(up: UpProcess) -> dict[str, str]:
    places = {}
    with httpx.Client(timeout=10) as client:
        for path in ("/observations", "/status", "/healthz", "/metrics", "/reports/usage",
                     "/reports/decisions?by=caller", "/reports/fallbacks"):
            answer = client.get(f"http://127.0.0.1:{up.admin_http_port}{path}",
                                headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
            assert answer.status_code == 200, (path, answer.status_code)
            places[f"sidecar admin {path}"] = answer.text
        places |= _console(client, f"http://127.0.0.1:{up.admin_http_port}")
        for path in ("/config_dump?include_eds", "/stats", "/stats?format=json",
                     "/clusters", "/server_info", "/listeners", "/runtime"):
            places[f"Envoy admin {path}"] = client.get(
                f"http://127.0.0.1:{up.admin_port}{path}").text
    return places


def test_the_canaries_went_through(run: dict[str, str]) -> None:
    log = run["sidecar and Envoy log (debug / warning)"]
    assert " sidecar.decision " in log  # the decision log was on
    assert '"canary-team"' in log or "canary-team" in log
    assert "target__canary-group__0__canary" in run["Envoy admin /clusters"]


def channel_token(run: dict[str, str]) -> str:
    """The token Envoy presents to the sidecar (made fresh by `sidecar up`): Envoy's admin
    shows it in `/config_dump`, which is why that port must never be exposed."""
    dump = run["Envoy admin /config_dump?include_eds"]
    marker = '"key": "x-sidecar-channel-token",'
    at = dump.index(marker) + len(marker)
    value = dump[at:].split('"value": "', 1)[1].split('"', 1)[0]
    assert len(value) >= 32
    return value


def test_the_channel_token_is_in_no_log_at_debug_level(run: dict[str, str]) -> None:
    """Issue #28, observation 4: hpack's debug log printed every decoded header, the channel
    token among them; whoever read the log could act as Envoy on the gRPC port."""
    token = channel_token(run)
    for place, text in run.items():
        if place.startswith(("provider ", "Envoy admin /config_dump")):
            continue
        assert token not in text, f"the channel token is in {place}"


def test_no_secret_appears_anywhere_readable(run: dict[str, str]) -> None:
    for place, text in run.items():
        if place.startswith("provider "):
            continue
        for secret in EVERY_SECRET:
            assert secret not in text, f"{secret[:24]}… found in {place}"


def test_each_provider_gets_its_own_key_and_none_of_the_callers_secrets(
        run: dict[str, str]) -> None:
    canary, second = run["provider canary received"], run["provider second received"]
    assert PROVIDER_KEY in canary and SECOND_KEY not in canary
    assert SECOND_KEY in second and PROVIDER_KEY not in second
    for text in (canary, second):
        for secret in CALLER_SECRETS:
            assert secret not in text
