"""Hostile inputs through the real stack (issue #28): a body that fits the limit natively
fits it bridged and on a cache miss; two `model` members are refused; a provider's answer
nested to death or garbled through a bridge is an error in the caller's dialect; none of it
leaves a traceback in the log."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.devstack.harness import UpProcess, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "hostile-inputs-caller-token"
KEYS = {"native": "key-native", "claude": "key-claude"}
CONFIG = """\
providers:
  native: {{base_url: '{native}', credential: {{env: KEY_NATIVE}}}}
  claude: {{base_url: '{claude}', credential: {{env: KEY_CLAUDE}},
           dialects: [anthropic_messages]}}
callers: [{{name: team, token_sha256: {digest}}}]
limits: {{max_request_body_bytes: 4194304}}
models:
  native: {{targets: [{{provider: native, model_ref: n}}]}}
  cached: {{response_cache: {{}}, targets: [{{provider: native, model_ref: c}}]}}
  bridged: {{bridges: true, targets: [{{provider: claude, model_ref: b}}]}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, dict]]:
    workdir = tmp_path_factory.mktemp("hostile")
    fakes = {name: FakeProvider(name, api_key=key) for name, key in KEYS.items()}
    with keyed_stack(workdir, list(fakes.values()), lambda providers: CONFIG.format(
            native=providers.base_url("native"), claude=providers.base_url("claude"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS) as (up, _):
        yield up, fakes
        log = Path(up.log_path).read_text() if up.log_path else ""
        assert "Traceback" not in log, log[log.index("Traceback"):][:2000]


@pytest.fixture
def fresh(stack) -> tuple[UpProcess, dict]:
    for provider in stack[1].values():
        provider.behaviour = Behaviour()
    return stack


def chat(up: UpProcess, body: bytes) -> httpx.Response:
    return httpx.post(up.base_url + "/v1/chat/completions", content=body, timeout=60,
                      headers={"authorization": f"Bearer {TOKEN}",
                               "content-type": "application/json"})


@pytest.mark.parametrize("group", ["native", "bridged", "cached"])
def test_a_body_of_emoji_that_fits_natively_fits_bridged_and_cached(fresh, group: str) -> None:
    """3.6 MB of emoji under a 4 MiB limit: re-serialised with `\\uXXXX` escapes it was
    three times larger and got a 413 on a bridge or a cache miss."""
    up, _ = fresh
    emoji = "\U0001F600" * 900_000  # 3.6 MB in UTF-8
    body = ('{"model": "%s", "max_tokens": 8, "messages": [{"role": "user", "content": "%s"}]}'
            % (group, emoji)).encode()
    assert 3_500_000 < len(body) < 4_194_304
    answer = chat(up, body)
    assert answer.status_code == 200, answer.text[:300]


def test_two_model_members_are_refused_in_the_callers_dialect(fresh) -> None:
    up, _ = fresh
    answer = chat(up, b'{"model": "native", "messages": [], "model": "native"}')
    assert answer.status_code == 400
    assert "more than one top-level 'model'" in answer.json()["error"]["message"]
    messages = httpx.post(up.base_url + "/v1/messages", timeout=30,
                          headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
                          content=b'{"model": "bridged", "model": "native", "messages": []}')
    assert messages.status_code == 400 and messages.json()["type"] == "error"


@pytest.mark.parametrize("status", [200, 400])
@pytest.mark.parametrize("answer", [b"[" * 5000 + b"]" * 5000, b"<html>bad gateway</html>",
                                    b'{"unexpected": true}', b""])
def test_a_hostile_answer_through_a_bridge_is_an_error_in_the_callers_dialect(
        fresh, status: int, answer: bytes) -> None:
    """It was a 500 "internal routing error" with a traceback for the nested answer, and
    the target's dialect for garbage; an empty 200 (no body for the bridge to translate)
    reached the caller as an empty 200."""
    up, fakes = fresh
    fakes["claude"].behaviour = (Behaviour(raw_body=answer) if status == 200
                                 else Behaviour(status=status, error_body=answer))
    reply = chat(up, b'{"model": "bridged", "max_tokens": 8, "messages": '
                     b'[{"role": "user", "content": "hi"}]}')
    assert reply.status_code == (502 if status == 200 else status)
    body = reply.json()
    assert set(body) == {"error"} and {"message", "type"} <= set(body["error"]), body
