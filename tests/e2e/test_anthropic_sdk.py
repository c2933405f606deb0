"""Issue #2 point 3 through the official Anthropic SDK: Messages, plain and streaming."""

from __future__ import annotations

import anthropic
import pytest

from sidecar.devstack.harness import ProviderThread
from tests.e2e.conftest import PROVIDER_KEYS, TOKEN_A, TOKEN_B, Stack

pytestmark = pytest.mark.e2e


def client(stack: Stack, token: str = TOKEN_A) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.base_url, api_key=token, max_retries=0)


def assert_clean_upstream(request) -> None:
    assert request.path == "/anthropic/v1/messages"
    assert request.json()["model"] == "claude-test-1"
    # Anthropic providers get their key as x-api-key, read from the configured file.
    assert request.headers["x-api-key"] == PROVIDER_KEYS["anthropic"]
    assert "authorization" not in request.headers
    assert request.headers.get("anthropic-version")
    raw = repr(request.headers) + request.body.decode()
    assert TOKEN_A not in raw and TOKEN_B not in raw


def test_messages_create(stack: Stack, providers: ProviderThread) -> None:
    message = client(stack).messages.create(
        model="claude-agent", max_tokens=256, messages=[{"role": "user", "content": "Hi"}]
    )
    assert message.model == "claude-test-1"
    assert message.content[0].text.startswith("Hello from anthropic serving claude-test-1")
    (request,) = providers.provider("anthropic").received
    assert_clean_upstream(request)
    assert request.json()["max_tokens"] == 256


def test_messages_stream(stack: Stack, providers: ProviderThread) -> None:
    pieces = []
    with client(stack).messages.stream(
        model="claude-agent", max_tokens=256, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        pieces.extend(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) == 10
    assert "".join(pieces) == final.content[0].text
    assert final.usage.output_tokens == 10
    (request,) = providers.provider("anthropic").received
    assert_clean_upstream(request)
    assert request.json()["stream"] is True


def test_models_list_in_anthropic_shape(stack: Stack) -> None:
    assert [m.id for m in client(stack).models.list()] == [
        "adaptive-agent", "weighted-trio", "claude-agent", "drip-group",
        "dead-group", "affinity-agent", "adaptive-agent-meta",
    ]


def test_openai_only_group_is_refused_on_messages_api(stack: Stack) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(stack).messages.create(
            model="weighted-trio", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "anthropic_messages" in caught.value.body["error"]["message"]
