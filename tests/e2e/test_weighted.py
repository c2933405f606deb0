"""The weighted rotation through real Envoy: 90 requests, weights 60/25/5."""

from __future__ import annotations

import openai
import pytest

from sidecar.devstack.harness import ProviderThread
from tests.e2e.conftest import TOKEN_A, Stack

pytestmark = pytest.mark.e2e


def test_ninety_requests_split_exactly_60_25_5(stack: Stack, providers: ProviderThread) -> None:
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=TOKEN_A, max_retries=0)
    served = []
    for _ in range(90):
        reply = client.chat.completions.create(
            model="weighted-trio", messages=[{"role": "user", "content": "count me"}]
        )
        served.append(reply.model)
    counts = {name: len(providers.provider(name).received) for name in ("p60", "p25", "p5")}
    assert counts == {"p60": 60, "p25": 25, "p5": 5}
    assert served.count("model-60") == 60 and served.count("model-5") == 5
