"""One chat request through the official `openai` SDK, as the routing benchmarks' callers
send it (routing_quality.py's single workload, family_stack.py's family members): streamed
with usage asked for, or unary; what came back, and how long it took."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import openai


@dataclass(frozen=True, slots=True)
class Reply:
    model: str | None        # the serving target's model, as the reply names it
    text: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None        # the SDK's error class name; None: answered
    seconds: float


async def chat(client: openai.AsyncOpenAI, group: str, messages: list[dict], stream: bool,
               **extra: Any) -> Reply:
    """`extra`: further request fields (`tools`)."""
    began = time.monotonic()
    model, text, usage, error = None, "", None, None
    try:
        if stream:
            chunks = await client.chat.completions.create(
                model=group, messages=messages, stream=True,
                stream_options={"include_usage": True}, **extra)
            async for chunk in chunks:
                model = chunk.model or model
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                usage = chunk.usage or usage
        else:
            reply = await client.chat.completions.create(model=group, messages=messages,
                                                         **extra)
            model, usage = reply.model, reply.usage
            text = reply.choices[0].message.content or ""
    except openai.APIError as exc:
        error = type(exc).__name__
    return Reply(model, text, usage.prompt_tokens if usage else 0,
                 usage.completion_tokens if usage else 0, error, time.monotonic() - began)
