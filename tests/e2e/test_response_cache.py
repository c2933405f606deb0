"""The exact-match response cache through real Envoy (issue #17): an identical non-streaming
request is answered from the sidecar without an upstream call and marked as a hit, per
caller unless the group shares; `cache-control: no-store` and streamed requests are never
cached; hits are not provider observations; a hit has a telemetry row of its own."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e

TOKENS = {"team-a": "cache-token-a", "team-b": "cache-token-b"}
CONFIG = """\
providers:
  both: {{base_url: '{both}', credential: {{env: KEY_BOTH}},
          dialects: [openai_chat, anthropic_messages]}}
  spare: {{base_url: '{spare}', credential: {{env: KEY_SPARE}}}}
callers:
  - {{name: team-a, token_sha256: {a}}}
  - {{name: team-b, token_sha256: {b}}}
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  cached:
    strategy: failover
    targets:
      - {{provider: both, model_ref: both-model}}
      - {{provider: spare, model_ref: spare-model}}
    response_cache: {{ttl_seconds: 600}}
  shared:
    targets: [{{provider: both, model_ref: both-model}}]
    response_cache: {{shared: true}}
  uncached:
    targets: [{{provider: both, model_ref: both-model}}]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[UpProcess, ProviderThread, Path]]:
    workdir: Path = tmp_path_factory.mktemp("cache")
    db = workdir / "telemetry.db"
    fakes = [FakeProvider("both", api_key="key-both"), FakeProvider("spare", api_key="key-spare")]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            both=providers.base_url("both"), spare=providers.base_url("spare"), db=db,
            **{who[-1]: hashlib.sha256(token.encode()).hexdigest()
               for who, token in TOKENS.items()}),
            {"both": "key-both", "spare": "key-spare"}) as (up, providers):
        yield up, providers, db


@pytest.fixture
def fresh(stack) -> tuple[UpProcess, ProviderThread, Path]:
    up, providers, db = stack
    providers.reset()
    return up, providers, db


def unique(label: str) -> str:
    return f"{label} {time.monotonic_ns()}"


def chat(up: UpProcess, group: str, text: str, who: str = "team-a", **extra
         ) -> tuple[str | None, dict]:
    """(x-sidecar-cache, the answer) for one Chat request through the official SDK."""
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKENS[who], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=group, messages=[{"role": "user", "content": text}], **extra)
    return raw.headers.get("x-sidecar-cache"), raw.parse().model_dump()


def received(providers: ProviderThread, name: str = "both") -> int:
    return len(providers.provider(name).received)


def test_an_identical_request_is_answered_from_the_cache(fresh) -> None:
    up, providers, _ = fresh
    text = unique("what is a cache")
    first_mark, first = chat(up, "cached", text)
    second_mark, second = chat(up, "cached", text)
    assert (first_mark, second_mark) == ("miss", "hit")
    assert second == first
    assert received(providers) == 1
    # A different request is a miss.
    assert chat(up, "cached", text + "?")[0] == "miss"
    assert received(providers) == 2


def test_key_order_and_whitespace_do_not_matter(fresh) -> None:
    up, providers, _ = fresh
    text = unique("normalized")
    headers = {"authorization": f"Bearer {TOKENS['team-a']}",
               "content-type": "application/json"}
    one = json.dumps({"model": "cached", "messages": [{"role": "user", "content": text}]})
    two = json.dumps({"messages": [{"content": text, "role": "user"}], "stream": False,
                      "model": "cached"}, indent=2)
    url = up.base_url + "/v1/chat/completions"
    assert httpx.post(url, content=one, headers=headers).headers["x-sidecar-cache"] == "miss"
    again = httpx.post(url, content=two, headers=headers)
    assert again.status_code == 200 and again.headers["x-sidecar-cache"] == "hit"
    assert received(providers) == 1


def test_callers_are_isolated_unless_the_group_shares(fresh) -> None:
    up, providers, _ = fresh
    text = unique("isolated")
    assert chat(up, "cached", text, "team-a")[0] == "miss"
    assert chat(up, "cached", text, "team-b")[0] == "miss"
    assert chat(up, "cached", text, "team-b")[0] == "hit"
    assert received(providers) == 2
    text = unique("shared")
    assert chat(up, "shared", text, "team-a")[0] == "miss"
    assert chat(up, "shared", text, "team-b")[0] == "hit"
    assert received(providers) == 3


def test_no_store_is_honoured(fresh) -> None:
    up, providers, _ = fresh
    text = unique("private")
    no_store = {"extra_headers": {"cache-control": "no-store"}}
    assert chat(up, "cached", text, **no_store)[0] is None
    assert chat(up, "cached", text, **no_store)[0] is None
    assert chat(up, "cached", text)[0] == "miss"  # nothing was stored
    assert chat(up, "cached", text, **no_store)[0] is None  # nor looked up
    assert received(providers) == 4


def test_streamed_requests_are_never_cached(fresh) -> None:
    up, providers, _ = fresh
    text = unique("streamed")
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKENS["team-a"],
                           max_retries=0)
    for _ in range(2):
        with client.chat.completions.with_streaming_response.create(
                model="cached", messages=[{"role": "user", "content": text}],
                stream=True) as response:
            assert "x-sidecar-cache" not in response.headers
            assert "".join(c.choices[0].delta.content or "" for c in response.parse()
                           if c.choices)
    assert chat(up, "cached", text)[0] == "miss"
    assert received(providers) == 3


def test_the_anthropic_sdk_gets_hits_too(fresh) -> None:
    up, providers, _ = fresh
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKENS["team-a"], max_retries=0)
    text = unique("messages")
    marks = []
    for _ in range(2):
        raw = client.messages.with_raw_response.create(
            model="cached", max_tokens=64, messages=[{"role": "user", "content": text}])
        marks.append(raw.headers.get("x-sidecar-cache"))
        assert raw.parse().content[0].text
    assert marks == ["miss", "hit"]
    assert received(providers) == 1
    assert providers.provider("both").received[0].path.endswith("/messages")


def test_a_beta_header_that_reaches_the_provider_is_part_of_the_key(fresh) -> None:
    """Issue #28: `anthropic-beta` changes what the provider does, so a request with another
    beta is not answered from the cache of one without it."""
    up, providers, _ = fresh
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKENS["team-a"], max_retries=0)
    text = unique("beta")
    marks = []
    for beta in (None, "output-128k-2025-02-19", "output-128k-2025-02-19"):
        raw = client.messages.with_raw_response.create(
            model="cached", max_tokens=64, messages=[{"role": "user", "content": text}],
            extra_headers={"anthropic-beta": beta} if beta else None)
        marks.append(raw.headers.get("x-sidecar-cache"))
    assert marks == ["miss", "miss", "hit"]
    assert received(providers) == 2
    assert providers.provider("both").received[1].headers["anthropic-beta"] == (
        "output-128k-2025-02-19")


def test_an_answer_after_a_fallback_is_cached(fresh) -> None:
    up, providers, _ = fresh
    providers.provider("both").behaviour.status = 503
    text = unique("fallback")
    assert chat(up, "cached", text)[0] == "miss"
    # the 503 earns one same-target retry first (retry_same_target 1, issue 40)
    assert (received(providers, "both"), received(providers, "spare")) == (2, 1)
    assert chat(up, "cached", text)[0] == "hit"
    assert received(providers, "spare") == 1


def test_hits_are_not_observations_and_have_their_own_row(fresh) -> None:
    up, _providers, db = fresh
    text = unique("observed")
    base = settled_count(up, "both/both-model")  # earlier tests' logs have all arrived
    start = time.time()
    chat(up, "uncached", unique("unrelated"))  # a normal request: observed
    chat(up, "cached", text)  # the miss: observed
    assert wait_for_count(up, "both/both-model", lambda n: n >= base + 2) == base + 2
    hit = chat(up, "cached", text)[0]
    chat(up, "uncached", unique("after"))  # logged after the hit's would have been
    assert hit == "hit"
    wait_for_count(up, "both/both-model", lambda n: n >= base + 3)
    assert settled_count(up, "both/both-model") == base + 3  # the hit added nothing
    rows = rows_since(db, start, 4)
    caches = sorted(str(r["cache"]) for r in rows)
    assert caches == ["None", "None", "hit", "miss"]
    hit_row = next(r for r in rows if r["cache"] == "hit")
    assert hit_row["serving_target"] is None and hit_row["status"] == 200
    assert hit_row["strategy"] == "" and hit_row["caller"] == "team-a"


def wait_for_count(up: UpProcess, target: str, done, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        url = f"http://127.0.0.1:{up.admin_http_port}/observations"
        count = httpx.get(url, timeout=5).json()["targets"].get(target, {}).get("count", 0)
        if done(count) or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def settled_count(up: UpProcess, target: str) -> int:
    """The observation count once it has not moved for half a second."""
    last, since = -1, time.monotonic()
    while True:
        count = wait_for_count(up, target, lambda n: True)
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= 0.5:
            return count
        time.sleep(0.05)


def rows_since(db: Path, start: float, expected: int) -> list[dict]:
    deadline = time.monotonic() + 30
    while True:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            found = [dict(r) for r in conn.execute(
                "SELECT * FROM request_rows WHERE started_at >= ?", (start,))]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
