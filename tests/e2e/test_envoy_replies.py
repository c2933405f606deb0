"""Errors Envoy produces by itself (upstream unreachable, sidecar down, malformed requests)
still reach the caller as JSON in the caller's dialect, through the local-reply mappers we
render; where Envoy answers before it has any header, in a body both SDKs read."""

from __future__ import annotations

import json
import socket
import time

import anthropic
import httpx
import openai
import pytest

from sidecar.config import load_config_text
from sidecar.devstack.demo import demo_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import free_port
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.local_replies import SIDECAR_UNAVAILABLE
from sidecar.envoy_config.render import render_envoy_yaml
from tests.e2e.conftest import TOKEN_A, Stack

pytestmark = pytest.mark.e2e


def test_unreachable_provider_is_a_json_503_in_each_dialect(stack: Stack) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        openai.OpenAI(base_url=stack.base_url + "/v1", api_key=TOKEN_A,
                      max_retries=0).chat.completions.create(
            model="dead-group", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 503
    assert caught.value.body["type"] == "server_error"
    assert "upstream connect error" in caught.value.body["message"]
    with pytest.raises(anthropic.APIStatusError) as caught_a:
        anthropic.Anthropic(base_url=stack.base_url, api_key=TOKEN_A,
                            max_retries=0).messages.create(
            model="dead-group", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught_a.value.status_code == 503
    assert caught_a.value.body["type"] == "error"
    assert caught_a.value.body["error"]["type"] == "api_error"


def test_sidecar_replies_are_not_rewrapped(stack: Stack) -> None:
    response = httpx.get(stack.base_url + "/v1/models",
                         headers={"authorization": "Bearer wrong"}, timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_sidecar_down_is_a_json_503_in_each_dialect(tmp_path) -> None:
    """Envoy with nothing listening on the ext_proc port."""
    addresses = EnvoyAddresses(listen=f"127.0.0.1:{free_port()}",
                               admin=f"127.0.0.1:{free_port()}",
                               ext_proc=f"127.0.0.1:{free_port()}",
                               secrets_dir=str(tmp_path / "secrets"))
    config = load_config_text(demo_config_text("http://127.0.0.1:9"))
    write_sds_files(config, tmp_path / "secrets")
    envoy_file = tmp_path / "envoy.yaml"
    envoy_file.write_text(render_envoy_yaml(config, addresses))
    envoy = start_envoy(envoy_file, "error")
    base = "http://" + addresses.listen
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.post(base + "/v1/chat/completions", json={"model": "x"},
                                      headers={"authorization": "Bearer t"}, timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "Envoy did not start"
                time.sleep(0.1)
        assert response.status_code == 503
        assert response.json()["error"]["message"] == SIDECAR_UNAVAILABLE
        response = httpx.post(base + "/v1/messages", json={"model": "x"},
                              headers={"x-api-key": "t"}, timeout=5)
        assert response.status_code == 503
        assert response.json() == {"type": "error", "error": {
            "type": "api_error", "message": SIDECAR_UNAVAILABLE}}
    finally:
        envoy.terminate()
        envoy.wait(10)


# --- Envoy's own replies to malformed requests (raw sockets: the SDKs cannot send these) ---

ANTHROPIC_HEADER = "anthropic-version: 2023-06-01\r\n"
OPENAI_KEYS = {"message", "type", "param", "code"}


def _raw(stack: Stack, request: bytes) -> tuple[int, dict[str, str], dict]:
    """Send `request` as is on a fresh connection; the status, headers and JSON body."""
    port = int(stack.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed before a response: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed mid-body"
            body += chunk
    return int(lines[0].split()[1]), headers, json.loads(body[:length])


def _request(line: str, headers: str = "", body: bytes = b"") -> bytes:
    length = f"content-length: {len(body)}\r\n" if body else ""
    return f"{line}\r\nhost: gateway\r\n{headers}{length}\r\n".encode() + body


def _assert_anthropic(body: dict, kind: str) -> None:
    assert body.get("type") == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == kind, body
    assert body["error"]["message"], body  # never an empty message


def _assert_openai(body: dict, kind: str) -> None:
    assert set(body) == {"error"} and set(body["error"]) == OPENAI_KEYS, body
    assert body["error"]["type"] == kind, body
    assert body["error"]["message"], body


UPGRADE = "connection: upgrade\r\nupgrade: websocket\r\n"


@pytest.mark.parametrize(("request_bytes", "status", "dialect", "kind"), [
    # A #fragment is refused once the headers are read (path_normalization_failed).
    pytest.param(_request("POST /v1/messages#x HTTP/1.1", "", b"{}"),
                 400, "anthropic", "invalid_request_error", id="fragment-anthropic-path"),
    pytest.param(_request("POST /v1/models#x HTTP/1.1", ANTHROPIC_HEADER, b"{}"),
                 400, "anthropic", "invalid_request_error", id="fragment-anthropic-version"),
    pytest.param(_request("POST /v1/chat/completions#x HTTP/1.1", ANTHROPIC_HEADER, b"{}"),
                 400, "openai", "invalid_request_error", id="fragment-openai-path-wins"),
    pytest.param(_request("POST /v1/responses#x HTTP/1.1", "", b"{}"),
                 400, "openai", "invalid_request_error", id="fragment-openai"),
    # OPTIONS * is parsed, then refused by the connection manager (absolute_path_rejected).
    pytest.param(_request("OPTIONS * HTTP/1.1", ANTHROPIC_HEADER),
                 404, "anthropic", "not_found_error", id="asterisk-anthropic-version"),
    pytest.param(_request("OPTIONS * HTTP/1.1"),
                 404, "openai", "invalid_request_error", id="asterisk-openai"),
    pytest.param(b"POST /v1/messages HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}",
                 400, "anthropic", "invalid_request_error", id="no-host-anthropic-path"),
    pytest.param(_request("GET /v1/models HTTP/1.1", ANTHROPIC_HEADER + UPGRADE),
                 403, "anthropic", "permission_error", id="websocket-anthropic-version"),
    pytest.param(_request("GET /v1/models HTTP/1.1", UPGRADE),
                 403, "openai", "invalid_request_error", id="websocket-openai"),
])
def test_envoy_rejections_after_the_headers_are_in_the_callers_dialect(
        stack: Stack, request_bytes: bytes, status: int, dialect: str, kind: str) -> None:
    code, headers, body = _raw(stack, request_bytes)
    assert code == status, body
    assert headers["content-type"] == "application/json"
    if dialect == "anthropic":
        _assert_anthropic(body, kind)
    else:
        _assert_openai(body, kind)
        assert body["error"]["code"] == f"gateway_{status}"


@pytest.mark.parametrize("method", ["get", "FOO", "Post", "M-SEARCH"])
def test_unknown_and_lowercase_methods_reach_the_sidecar(stack: Stack, method: str) -> None:
    """Envoy's codec would refuse them before reading a header (400, dialect unknown);
    with custom methods allowed the sidecar answers, in the caller's dialect."""
    key = f"x-api-key: {TOKEN_A}\r\n"
    code, headers, body = _raw(stack, _request(f"{method} /v1/messages HTTP/1.1", key))
    assert code == 405 and headers["content-type"] == "application/json"
    _assert_anthropic(body, "invalid_request_error")
    assert body["error"]["message"] == f"{method} is not allowed on /v1/messages; use POST"
    code, _, body = _raw(stack, _request(f"{method} /v1/chat/completions HTTP/1.1",
                                         key + ANTHROPIC_HEADER))
    assert code == 405
    _assert_openai(body, "invalid_request_error")
    code, _, body = _raw(stack, _request(f"{method} /v1/models HTTP/1.1", ANTHROPIC_HEADER))
    assert code == 401
    _assert_anthropic(body, "authentication_error")


@pytest.mark.parametrize(("request_bytes", "status", "details"), [
    pytest.param(_request("POST /v1/messages HTTP/1.1",
                          ANTHROPIC_HEADER + "x-pad: " + "a" * 70_000 + "\r\n"),
                 431, "http1.headers_too_large", id="header-too-large"),
    pytest.param(_request("POST /v1/messages/" + "a" * 70_000 + " HTTP/1.1", ANTHROPIC_HEADER),
                 431, "http1.headers_too_large", id="path-too-large"),
    pytest.param(_request("POST /v1/messages HTTP/1.1", ANTHROPIC_HEADER + "".join(
        f"x-h{index}: a\r\n" for index in range(150))),
                 431, "http1.too_many_headers", id="too-many-headers"),
    pytest.param(_request("POST * HTTP/1.1", ANTHROPIC_HEADER, b"{}"),
                 400, "http1.invalid_url", id="asterisk-with-post"),
    pytest.param(_request("G@T /v1/messages HTTP/1.1", ANTHROPIC_HEADER),
                 400, "http1.codec_error", id="method-not-a-token"),
    pytest.param(_request("POST /v1/messages HTTP/1.1", ANTHROPIC_HEADER + "x-bad: a\x01b\r\n"),
                 400, "http1.invalid_characters", id="control-character-in-a-header"),
    pytest.param(_request("POST /v1/messages HTTP/1.1", ANTHROPIC_HEADER
                          + "content-length: 5\r\ntransfer-encoding: chunked\r\n"),
                 400, "http1.content_length_and_chunked_not_allowed",
                 id="content-length-and-chunked"),
    pytest.param(_request("POST /v1/messages HTTP/1.0", ANTHROPIC_HEADER, b"{}"),
                 426, "low_version", id="http-1.0"),
    pytest.param(_request("POST /v1/messages HTTP/1.1",
                          ANTHROPIC_HEADER + "transfer-encoding: gzip\r\n"),
                 501, "http1.invalid_transfer_encoding", id="unknown-transfer-encoding"),
])
def test_requests_envoy_cannot_parse_get_a_body_both_sdks_read(
        stack: Stack, request_bytes: bytes, status: int, details: str) -> None:
    """Envoy's codec answers these before the connection manager has any header, so no
    rule can see the path or `anthropic-version`: the body is both dialects at once."""
    code, headers, body = _raw(stack, request_bytes)
    assert code == status, body
    assert headers["content-type"] == "application/json"
    assert body.get("type") == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == OPENAI_KEYS, body
    assert body["error"]["type"] == ("api_error" if status >= 500 else "invalid_request_error")
    assert body["error"]["code"] == f"gateway_{status}"
    assert details in body["error"]["message"], body


def test_an_oversized_header_is_a_431_each_sdk_parses(stack: Stack) -> None:
    pad = {"x-pad": "a" * 70_000}
    with pytest.raises(openai.APIStatusError) as caught:
        openai.OpenAI(base_url=stack.base_url + "/v1", api_key=TOKEN_A, max_retries=0,
                      default_headers=pad).chat.completions.create(
            model="dead-group", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 431
    assert caught.value.type == "invalid_request_error" and caught.value.code == "gateway_431"
    assert "Request Header Fields Too Large" in caught.value.message
    with pytest.raises(anthropic.APIStatusError) as caught_a:
        anthropic.Anthropic(base_url=stack.base_url, api_key=TOKEN_A, max_retries=0,
                            default_headers=pad).messages.create(
            model="dead-group", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught_a.value.status_code == 431
    assert caught_a.value.type == "invalid_request_error"
    assert "Request Header Fields Too Large" in (caught_a.value.api_message or "")
