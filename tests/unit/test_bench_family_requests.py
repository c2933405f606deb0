"""The family benchmark's requests (bench/family_requests.py): the simulator prices a
request on the body the stack's client sends, as the fake providers count it (issue 41:
it priced `len(prompt) / 4`). Checked against the bytes the official `openai` SDK really
puts on the wire (an httpx transport that records them), with `model` rewritten as the
gateway rewrites it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from family_requests import TOOLS, follow_up, input_tokens, opening, reply_text
from family_workloads import AGENT, CHAT, SIMPLE, Job

from sidecar.devstack.provider_wire import prompt_tokens

REPLY = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def sent_by_the_sdk(job: Job, messages: list[dict]) -> bytes:
    seen: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        if json.loads(request.content).get("stream"):
            return httpx.Response(200, text="data: [DONE]\n\n",
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=REPLY)

    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(answer)))
    extra = {"tools": TOOLS} if job.kind == AGENT else {}
    if job.stream:
        for _ in client.chat.completions.create(
                model="family", messages=messages, stream=True,
                stream_options={"include_usage": True}, **extra):
            pass
    else:
        client.chat.completions.create(model="family", messages=messages, **extra)
    (body,) = seen
    return body


def test_the_simulator_counts_the_input_the_fake_providers_count() -> None:
    for job in (Job(0.0, SIMPLE, 7, False, "In one sentence, what is entropy? (question 7)", 40),
                Job(0.0, CHAT, 8, True, "Plan a trip to Lisbon — día uno, please.", 300),
                Job(0.0, AGENT, 9, False, "Fix the failing test in src/app.py", 120)):
        messages = opening(job)
        for turn in (1, 2):
            wire = sent_by_the_sdk(job, messages)
            # The gateway replaces only the top-level model (here "family" → "fast_dear").
            upstream = len(wire) - len(b'"family"') + len(b'"fast_dear"')
            assert input_tokens(job, messages, "fast_dear") == prompt_tokens(upstream), job
            messages = follow_up(messages, reply_text(30), job, turn)
