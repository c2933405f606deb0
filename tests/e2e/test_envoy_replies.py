"""Errors Envoy produces by itself (upstream unreachable, sidecar down) still reach the
caller as JSON in the caller's dialect, through the local-reply mappers we render."""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest

from sidecar.config import load_config_text
from sidecar.devstack.demo import demo_config_text
from sidecar.devstack.harness import free_port
from sidecar.devstack.stack import start_envoy
from sidecar.envoy_config.addresses import EnvoyAddresses
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
                               ext_proc=f"127.0.0.1:{free_port()}")
    config = load_config_text(demo_config_text("http://127.0.0.1:9"))
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
