"""Hostile run, second pass (issue 28): the surfaces added since the first security pass,
on their own stack at `--log-level debug` so that the log canary sees everything a debug
log can hold. Each attack reproduces an observation of the issue:

1. Streams around a token quota: OpenAI Chat streams without `stream_options` under a
   100-token daily limit (usage is sent in a stream only when asked).
2. Provider answers nested 5,000 deep, HTML, garbage or of the wrong shape, through a bridge
   in both directions: each must be an error in the caller's dialect, never a 500.
3. Bodies with two top-level `model` (or `stream`) members on every endpoint.
4. 3.6 MB of emoji under a 4 MiB limit, native, bridged and on a cache miss.
5. Configuration files nested 20,000 deep, a FIFO, 17 MiB, two 10 MB parses and aliases
   that expand a 106 KB file to 10^10 values: each a rejected, counted reload that never
   blocks; the watch then applies a good edit; RSS after.
6. The log at debug level searched for the channel token, the admin token, provider keys and
   caller tokens (and their SHA-256).

Called by bench/hostile.py; `run(seed)` returns its table rows and facts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

from sidecar.devstack.harness import ProviderThread, UpProcess, pid_alive
from sidecar.devstack.providers import Behaviour, FakeProvider

TOKEN = "hostile-surfaces-caller-token"
QUOTA_TOKEN = "hostile-surfaces-quota-token"
ADMIN_TOKEN = "hostile-surfaces-admin-token-5f1c"
KEYS = {"p": "hostile-surfaces-key-p", "claude": "hostile-surfaces-key-claude"}
ANTHROPIC_HEADERS = {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"}

CONFIG = """\
providers:
  p: {{base_url: '{p}', credential: {{env: KEY_P}}}}
  claude: {{base_url: '{claude}', credential: {{env: KEY_CLAUDE}},
           dialects: [anthropic_messages]}}
callers:
  - {{name: c, token_sha256: {digest}}}
  - {{name: q, token_sha256: {quota_digest}, models: [g], quotas: {{tokens_per_day: 100}}}}
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
limits: {{max_request_body_bytes: 4194304}}
models:
  g: {{targets: [{{provider: p, model_ref: m}}]}}
  cached: {{response_cache: {{}}, targets: [{{provider: p, model_ref: c}}]}}
  to-claude: {{bridges: true, targets: [{{provider: claude, model_ref: b}}]}}
  to-openai: {{bridges: true, targets: [{{provider: p, model_ref: o}}]}}
"""

NESTED = b"[" * 5000 + b"]" * 5000
HOSTILE_ANSWERS: dict[str, Behaviour] = {
    "nested 200": Behaviour(raw_body=NESTED, content_type="application/json"),
    "nested 400": Behaviour(status=400, error_body=b'{"error": ' + NESTED + b"}"),
    "HTML 200": Behaviour(raw_body=b"<html><body>Bad gateway</body></html>",
                          content_type="text/html"),
    "garbage 200": Behaviour(raw_body=bytes(range(256)) * 4,
                             content_type="application/json"),
    "wrong shape 200": Behaviour(raw_body=b'{"choices": 5, "content": {"a": [1]}}',
                                 content_type="application/json"),
    "empty 200": Behaviour(raw_body=b"", content_type="application/json"),
    "truncated 200": Behaviour(raw_body=b'{"id": "x", "choices": [{"message": {',
                               content_type="application/json"),
    "1e999999 200": Behaviour(raw_body=b'{"usage": {"prompt_tokens": 1e999999}}',
                              content_type="application/json"),
}


def run(seed: int) -> tuple[list[tuple[str, dict, bool]], dict[str, object]]:
    fakes = [FakeProvider(name, api_key=key) for name, key in KEYS.items()]
    with ProviderThread(fakes) as providers, \
            tempfile.TemporaryDirectory(prefix="hostile-surfaces-") as tmp:
        workdir = Path(tmp)
        config = workdir / "config.yaml"
        good = CONFIG.format(p=providers.base_url("p"), claude=providers.base_url("claude"),
                             digest=sha256(TOKEN), quota_digest=sha256(QUOTA_TOKEN))
        config.write_text(good)
        admin = workdir / "admin.token"
        admin.write_text(ADMIN_TOKEN + "\n")
        log_path = workdir / "up.log"
        up = UpProcess(["--log-level", "debug", "--config", str(config),
                        "--admin-token-file", str(admin)],
                       env={f"KEY_{name.upper()}": key for name, key in KEYS.items()},
                       log_path=log_path)
        rows: list[tuple[str, dict, bool]] = []
        with up.running():
            pid = int(up.banner_value(r"sidecar pid (\d+)"))
            channel = channel_token(up)

            def after(name: str, figures: dict, wanted: Callable[[dict], bool]) -> None:
                ok = wanted(figures) and pid_alive(pid) and serves(up)
                rows.append((name, figures, ok))
                print(f"{name}: {figures}; as wanted and still serving: {ok}", flush=True)

            after("OpenAI streams without stream_options under a 100-token quota",
                  quota_streams(up, providers), lambda f: 1 <= f["served"] <= 5)
            after("hostile answers through a bridge, both directions",
                  bridged_answers(up, providers),
                  lambda f: f["in_the_callers_dialect"] == f["cases"]
                  and "500" not in f["statuses"])
            after("two top-level model (or stream) members", duplicate_models(up),
                  lambda f: f["statuses"] == {"400": f["requests"]})
            after("3.6 MB of emoji under a 4 MiB limit", emoji_bodies(up),
                  lambda f: set(f["statuses"].values()) == {200})
            after("hostile configuration files", hostile_configs(up, config, good, pid),
                  lambda f: f["nested_20000_rejected_by_watch"] and f["fifo_reload"] == {
                      "status": 422, "seconds": f["fifo_reload"]["seconds"]}
                  and f["fifo_reload"]["seconds"] < 5 and f["17_mib_reload_status"] == 422
                  and f["10_mb_reload_statuses"] == [422, 422]
                  and f["alias_bomb_reload"]["status"] == 422
                  and f["good_edit_applied_by_watch"])
        log = log_path.read_text(errors="replace")
    canaries = [TOKEN, QUOTA_TOKEN, ADMIN_TOKEN, channel, *KEYS.values()]
    canaries += [sha256(secret) for secret in canaries]
    found = sum(log.count(secret) for secret in canaries)
    rows.append(("debug log searched for secrets (channel, admin, caller tokens, provider "
                 "keys and their SHA-256)",
                 {"canaries": len(canaries), "found": found,
                  "tracebacks": log.count("Traceback"), "log_kib": len(log.encode()) // 1024},
                 found == 0 and "Traceback" not in log))
    return rows, {"seed": seed}


def channel_token(up: UpProcess) -> str:
    """The token Envoy presents on the gRPC port, as Envoy's admin `/config_dump` shows it
    (the reason that port must never be exposed)."""
    dump = httpx.get(f"http://127.0.0.1:{up.admin_port}/config_dump?include_eds",
                     timeout=10).text
    found = re.search(r'"key": "x-sidecar-channel-token",\s*"value": "([^"]+)"', dump)
    if found is None:
        raise SystemExit("the channel token is not in Envoy's /config_dump")
    return found.group(1)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def serves(up: UpProcess, token: str = TOKEN) -> bool:
    """A normal request through the stack (group `g`) is answered."""
    response = httpx.post(f"{up.base_url}/v1/chat/completions",
                          headers={"authorization": f"Bearer {token}"},
                          json={"model": "g", "messages": [{"role": "user", "content": "hi"}]},
                          timeout=10)
    return response.status_code == 200


def chat_stream(up: UpProcess, token: str) -> int:
    with httpx.stream("POST", up.base_url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {token}"},
                      json={"model": "g", "stream": True, "messages": [
                          {"role": "user", "content": "count to sixteen"}]}) as response:
        response.read()
        return response.status_code


def quota_streams(up: UpProcess, providers: ProviderThread) -> dict:
    providers.provider("p").behaviour = Behaviour(text=" ".join(["word"] * 16))
    statuses: list[int] = []
    for _ in range(8):
        statuses.append(chat_stream(up, QUOTA_TOKEN))
        time.sleep(0.3)  # the ledger counts a stream when its access-log batch arrives
    providers.provider("p").behaviour = Behaviour()
    return {"streams": len(statuses), "served": statuses.count(200),
            "refused_429": statuses.count(429)}


def bridged_answers(up: UpProcess, providers: ProviderThread) -> dict:
    """Each hostile answer from the Anthropic provider to an OpenAI Chat caller, and from the
    OpenAI provider to an Anthropic caller."""
    statuses: Counter[str] = Counter()
    callers_dialect = 0
    cases = 0
    with httpx.Client(timeout=30) as client:
        for behaviour in HOSTILE_ANSWERS.values():
            for provider, send, in_dialect in (("claude", _chat_to_claude, _openai_error),
                                               ("p", _messages_to_openai, _anthropic_error)):
                providers.provider(provider).behaviour = behaviour
                answer = send(client, up)
                cases += 1
                statuses[str(answer.status_code)] += 1
                callers_dialect += in_dialect(answer)
                providers.provider(provider).behaviour = Behaviour()
    return {"cases": cases, "statuses": dict(sorted(statuses.items())),
            "in_the_callers_dialect": callers_dialect}


def _chat_to_claude(client: httpx.Client, up: UpProcess) -> httpx.Response:
    return client.post(up.base_url + "/v1/chat/completions",
                       headers={"authorization": f"Bearer {TOKEN}"},
                       json={"model": "to-claude", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}]})


def _messages_to_openai(client: httpx.Client, up: UpProcess) -> httpx.Response:
    return client.post(up.base_url + "/v1/messages", headers=ANTHROPIC_HEADERS,
                       json={"model": "to-openai", "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}]})


def _openai_error(answer: httpx.Response) -> bool:
    body = _json(answer)
    return (answer.status_code >= 400 and isinstance(body, dict)
            and isinstance(body.get("error"), dict) and "message" in body["error"]
            and body.get("type") != "error")


def _anthropic_error(answer: httpx.Response) -> bool:
    body = _json(answer)
    return (answer.status_code >= 400 and isinstance(body, dict)
            and body.get("type") == "error" and isinstance(body.get("error"), dict))


def _json(answer: httpx.Response) -> object:
    try:
        return json.loads(answer.content)
    except ValueError:
        return None


def duplicate_models(up: UpProcess) -> dict:
    bodies = (b'{"model": "g", "max_tokens": 8, "messages": [], "model": "to-claude"}',
              b'{"model": "g", "max_tokens": 8, "stream": false, "messages": [], "stream": true}')
    statuses: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for path, headers in (("/v1/chat/completions", {"authorization": f"Bearer {TOKEN}"}),
                              ("/v1/messages", ANTHROPIC_HEADERS),
                              ("/v1/responses", {"authorization": f"Bearer {TOKEN}"})):
            for body in bodies:
                answer = client.post(up.base_url + path, content=body,
                                     headers={**headers, "content-type": "application/json"})
                statuses[str(answer.status_code)] += 1
    return {"requests": sum(statuses.values()), "statuses": dict(statuses)}


def emoji_bodies(up: UpProcess) -> dict:
    emoji = "\U0001F600" * 900_000
    statuses: dict[str, int] = {}
    with httpx.Client(timeout=60) as client:
        for group in ("g", "to-claude", "cached"):
            body = json.dumps({"model": group, "max_tokens": 8, "messages": [
                {"role": "user", "content": emoji}]}, ensure_ascii=False).encode()
            answer = client.post(up.base_url + "/v1/chat/completions", content=body,
                                 headers={"authorization": f"Bearer {TOKEN}",
                                          "content-type": "application/json"})
            statuses[group] = answer.status_code
    return {"body_mb": round(len(body) / 1e6, 2), "statuses": statuses}


def hostile_configs(up: UpProcess, path: Path, good: str, pid: int) -> dict:
    """The file watch sees each write; `POST /reload` is timed on the FIFO."""
    rss_before = rss_mb(pid)
    rejected = _reloads(up, "rejected")
    figures: dict[str, object] = {}
    path.write_text("models: " + "[" * 20000 + "]" * 20000)
    figures["nested_20000_rejected_by_watch"] = _until(
        lambda: _reloads(up, "rejected") > rejected)
    path.unlink()
    os.mkfifo(path)
    started = time.monotonic()
    answer = _reload(up)
    figures["fifo_reload"] = {"status": answer.status_code,
                              "seconds": round(time.monotonic() - started, 2)}
    path.unlink()
    path.write_bytes(b"models: {}\n" + b"#" * (17 * 1024 * 1024))
    figures["17_mib_reload_status"] = _reload(up).status_code
    # Two 10 MB parses within the event budget that fail validation (observed: 91 -> 234 MB).
    for _ in range(2):
        path.write_text("models: [" + "\"xxxxxxxxxxxxxxxxxx\", " * 450_000 + "1]\n")
        figures.setdefault("10_mb_reload_statuses", []).append(_reload(up).status_code)
    started = time.monotonic()
    path.write_text(alias_bomb())
    figures["alias_bomb_reload"] = {"status": _reload(up).status_code,
                                    "seconds": round(time.monotonic() - started, 2)}
    applied = _reloads(up, "applied")
    path.write_text(good.replace("model_ref: m}", "model_ref: m, weight: 2}"))
    figures["good_edit_applied_by_watch"] = _until(lambda: _reloads(up, "applied") > applied)
    figures["rss_mb"] = {"before": round(rss_before, 1), "after": round(rss_mb(pid), 1)}
    figures["reloads_rejected"] = int(_reloads(up, "rejected") - rejected)
    return figures


def alias_bomb() -> str:
    """106 KB: 1,000 groups of the same 1,000 targets of the same 10,000 tags (observed:
    2 GB in 15 s of validation, never ending)."""
    tags = ", ".join(f"t{i}" for i in range(10_000))
    return "\n".join([
        "providers: {p: {base_url: 'http://127.0.0.1:9/v1', credential: null}}",
        f"x-tags: &tags [{tags}]", "x-target: &target {provider: p, model_ref: m, tags: *tags}",
        "x-targets: &targets [" + ", ".join(["*target"] * 1000) + "]", "models:",
        *(f"  g{i}: {{targets: *targets}}" for i in range(1000))]) + "\n"


def _reload(up: UpProcess) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{up.admin_http_port}/reload", timeout=30,
                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})


def _reloads(up: UpProcess, outcome: str) -> float:
    metrics = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=10,
                        headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).text
    line = f'sidecar_config_reloads_total{{outcome="{outcome}"}} '
    return next((float(row.split(" ")[-1]) for row in metrics.splitlines()
                 if row.startswith(line)), 0.0)


def _until(condition: Callable[[], bool], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
