"""Issue #2 point 5: every client-facing error in the caller's dialect, with the right status."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.harness import ProviderThread
from tests.e2e.conftest import TOKEN_A, TOKEN_B, Stack

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


def post(stack: Stack, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(stack.base_url + path, content=body,
                      headers={"content-type": "application/json", **headers}, timeout=10)


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> str:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code:
        assert error["code"] == code
    assert error["message"]
    return error["message"]


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status
    payload = response.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == kind
    return payload["error"]["message"]


def test_missing_token_is_401_in_both_dialects(stack: Stack) -> None:
    message = assert_openai_error(post(stack, CHAT, b"{}", {}), 401, "invalid_api_key")
    assert "Authorization: Bearer" in message
    assert_anthropic_error(post(stack, MESSAGES, b"{}", {}), 401, "authentication_error")


def test_unknown_token_is_401_through_both_sdks(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        openai.OpenAI(base_url=stack.base_url + "/v1", api_key="not-a-caller",
                      max_retries=0).chat.completions.create(
            model="adaptive-agent", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "invalid_api_key"
    assert "not-a-caller" not in str(caught.value)
    with pytest.raises(anthropic.AuthenticationError) as caught_a:
        anthropic.Anthropic(base_url=stack.base_url, api_key="not-a-caller",
                            max_retries=0).messages.create(
            model="claude-agent", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught_a.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("model", ["private-group", "no-such-group"])
def test_forbidden_or_unknown_group_is_404_model_not_found(
    stack: Stack, providers: ProviderThread, model: str
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        openai.OpenAI(base_url=stack.base_url + "/v1", api_key=TOKEN_A,
                      max_retries=0).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "model_not_found"
    message = caught.value.body["message"]
    assert model in message
    # Same words whether the group exists or not, and no other group is named.
    assert message == f"The model '{model}' does not exist or you do not have access to it."
    with pytest.raises(anthropic.NotFoundError) as caught_a:
        anthropic.Anthropic(base_url=stack.base_url, api_key=TOKEN_A,
                            max_retries=0).messages.create(
            model=model, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught_a.value.body["error"]["type"] == "not_found_error"
    assert all(not p.received for p in providers.server.providers.values())


def test_group_of_another_caller_is_404_for_team_b_too(stack: Stack) -> None:
    response = post(stack, CHAT, b'{"model":"adaptive-agent","messages":[]}',
                    {"authorization": f"Bearer {TOKEN_B}"})
    assert_openai_error(response, 404, "model_not_found")


def test_malformed_json_is_400(stack: Stack) -> None:
    auth = {"authorization": f"Bearer {TOKEN_A}"}
    message = assert_openai_error(post(stack, CHAT, b'{"model": "adaptive-agent",', auth), 400)
    assert "not valid JSON" in message
    message = assert_anthropic_error(post(stack, MESSAGES, b"[1, 2", {"x-api-key": TOKEN_A}),
                                     400, "invalid_request_error")
    assert "not valid JSON" in message
    assert_openai_error(post(stack, CHAT, b'["model"]', auth), 400)


def test_missing_model_is_400(stack: Stack) -> None:
    response = post(stack, CHAT, b'{"messages":[{"role":"user","content":"x"}]}',
                    {"authorization": f"Bearer {TOKEN_A}"})
    message = assert_openai_error(response, 400)
    assert "'model'" in message
    assert response.json()["error"]["param"] == "model"
    response = post(stack, MESSAGES, b'{"max_tokens":5,"messages":[]}', {"x-api-key": TOKEN_A})
    assert "'model'" in assert_anthropic_error(response, 400, "invalid_request_error")


def test_empty_body_and_wrong_method_and_unknown_path(stack: Stack) -> None:
    auth = {"authorization": f"Bearer {TOKEN_A}"}
    assert_openai_error(post(stack, CHAT, b"", auth), 400)
    response = httpx.get(stack.base_url + CHAT, headers=auth, timeout=10)
    assert_openai_error(response, 405)
    response = post(stack, "/v1/embeddings", b"{}", auth)
    assert "Unknown endpoint /v1/embeddings" in assert_openai_error(response, 404)
