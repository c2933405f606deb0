"""Bridged answers look native (issue #27, observations 10 and 11): one rule for the answer's
`model` in every path — the model that served, as its provider named it — and every error
the gateway itself makes is in the caller's dialect, whatever the target's API."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour
from tests.e2e.wire.conftest import TOKEN, Stack, prompt

pytestmark = pytest.mark.e2e


def openai_shaped(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body  # no Anthropic `type: error` envelope
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def anthropic_shaped(response: httpx.Response) -> dict:
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


# --- the answer's model ----------------------------------------------------------------------

def test_native_answers_name_the_serving_model(fresh: Stack) -> None:
    assert fresh.openai.chat.completions.create(model="chain", messages=prompt()).model == (
        "o1-model")
    chunks = list(fresh.openai.chat.completions.create(model="chain", messages=prompt(),
                                                       stream=True))
    assert {chunk.model for chunk in chunks} == {"o1-model"}


def test_a_bridged_chat_answer_names_the_serving_model_in_every_path(fresh: Stack) -> None:
    """It used to be the group's name in some paths and the target's in others."""
    unary = fresh.openai.chat.completions.create(model="bridged-claude", messages=prompt())
    assert unary.model == "c1-bridged"
    chunks = list(fresh.openai.chat.completions.create(
        model="bridged-claude", messages=prompt(), stream=True,
        stream_options={"include_usage": True}))
    assert len(chunks) > 3 and {chunk.model for chunk in chunks} == {"c1-bridged"}
    response = fresh.openai.responses.create(model="bridged-claude", input="hello")
    assert response.model == "c1-bridged"
    with fresh.openai.responses.stream(model="bridged-claude", input="hello") as events:
        final = events.get_final_response()
    assert final.model == "c1-bridged"


def test_a_bridged_messages_answer_names_the_serving_model_in_every_event(fresh: Stack) -> None:
    message = fresh.anthropic.messages.create(model="bridged-openai", max_tokens=32,
                                              messages=prompt())
    assert message.model == "o1-bridged"
    with fresh.anthropic.messages.stream(model="bridged-openai", max_tokens=32,
                                         messages=prompt()) as stream:
        starts = [event.message.model for event in stream if event.type == "message_start"]
    assert starts == ["o1-bridged"]


def test_after_a_bridged_fallback_the_answer_names_the_fallback(fresh: Stack) -> None:
    fresh.behave("c1", Behaviour(status=503))
    assert fresh.openai.chat.completions.create(
        model="bridged-claude", messages=prompt()).model == "c2-bridged"


# --- the gateway's errors --------------------------------------------------------------------

def post_chat(stack: Stack, group: str) -> httpx.Response:
    return httpx.post(stack.up.base_url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {TOKEN}"},
                      json={"model": group, "messages": prompt()})


def post_messages(stack: Stack, group: str) -> httpx.Response:
    return httpx.post(stack.up.base_url + "/v1/messages", timeout=30,
                      headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
                      json={"model": group, "max_tokens": 16, "messages": prompt()})


@pytest.mark.parametrize(("behaviour_name", "status", "kind"), [
    ("anthropic_rate_limited", 429, "rate_limit_exceeded"),
    ("anthropic_overloaded", 502, "server_error"),
])
def test_an_openai_caller_of_anthropic_targets_gets_openai_errors(
        fresh: Stack, behaviour_name: str, status: int, kind: str) -> None:
    for name in ("c1", "c2"):
        fresh.behave(name, behaviour(behaviour_name))
    response = post_chat(fresh, "bridged-claude")
    assert response.status_code == status
    error = openai_shaped(response)
    # Two targets, three attempts (c1, c2, c1).
    assert error["type"] == kind and "attempts: 3" in error["message"]
    with pytest.raises(openai.APIStatusError) as raised:
        fresh.openai.chat.completions.create(model="bridged-claude", messages=prompt())
    assert raised.value.status_code == status


@pytest.mark.parametrize(("provider_status", "status", "kind"), [
    (429, 429, "rate_limit_error"), (500, 502, "api_error")])
def test_an_anthropic_caller_of_openai_targets_gets_anthropic_errors(
        fresh: Stack, provider_status: int, status: int, kind: str) -> None:
    for name in ("o1", "o2"):
        fresh.behave(name, Behaviour(status=provider_status))
    response = post_messages(fresh, "bridged-openai")
    assert response.status_code == status
    assert anthropic_shaped(response)["type"] == kind
    with pytest.raises(anthropic.APIStatusError) as raised:
        fresh.anthropic.messages.create(model="bridged-openai", max_tokens=16,
                                        messages=prompt())
    assert raised.value.status_code == status


def test_a_connect_failure_to_a_bridged_target_is_in_the_callers_dialect(fresh: Stack) -> None:
    response = post_chat(fresh, "bridged-dead")
    assert response.status_code == 503
    assert openai_shaped(response)["type"] == "server_error"


def test_a_providers_request_error_is_translated_for_the_caller(fresh: Stack) -> None:
    """A 400 is the caller's own: passed on, in the caller's shape, its message kept."""
    fresh.behave("c1", behaviour("anthropic_context_length"))
    fresh.behave("c2", behaviour("anthropic_context_length"))
    response = httpx.post(fresh.up.base_url + "/v1/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {TOKEN}"},
                          json={"model": "bridged-claude", "max_tokens": 8,
                                "messages": [{"role": "user", "content": "w " * 400}]})
    assert response.status_code == 400
    assert "prompt is too long" in openai_shaped(response)["message"]
