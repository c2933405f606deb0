"""The requests of a family member's jobs, one definition for the stack's client
(family_stack.py) and the simulator (family_sim.py), so both route and price the same
bodies (issue 41).

The simulator used to route a prompt string of its own (the history as "assistant: word
word…") and price `len(prompt) / 4` input tokens, while the stack's client sent the
`openai` SDK's JSON with a marker per turn and the fake providers count a request's whole
body (devstack/provider_wire.prompt_tokens: bytes / 4, the framing included). For the short
simple requests that decide the saving, the framing is most of the input; now both sides
build the same body and count it the same way, and the simulator's summary is the
gateway's own (`request_shape` on that body).
"""

from __future__ import annotations

import json
from typing import Any

from family_workloads import AGENT, Job

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


def think_s(job: Job) -> float:
    """A user's pause between a reply and the conversation's next turn (1–4 s), the same
    for a job on both sides."""
    return 1.0 + 3.0 * ((job.ident * 2654435761) % 1000) / 1000


def opening(job: Job) -> list[dict[str, Any]]:
    """The first turn's messages. The marker tells the fake providers how long to answer
    (family_stack.py) and keeps every request's body distinct."""
    return [{"role": "user",
             "content": f"{job.prompt} [job {job.ident}.0 reply {job.output_tokens}]"}]


def reply_text(words: int) -> str:
    """What a fake provider answers: `words` words (devstack/providers.py reply_words)."""
    return " ".join(["word"] * max(1, words))


def follow_up(messages: list[dict[str, Any]], reply: str, job: Job, turn: int
              ) -> list[dict[str, Any]]:
    """The history with the reply, then turn `turn`'s question."""
    return [*messages, {"role": "assistant", "content": reply or "word"},
            {"role": "user", "content": f"and then? (turn {turn}) "
                                        f"[job {job.ident}.{turn} reply {job.output_tokens}]"}]


def body(job: Job, messages: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The request body as the SDK sends it (sdk_chat.py), `model` as the gateway rewrites
    it for the target."""
    sent: dict[str, Any] = {"messages": messages, "model": model}
    if job.stream:
        sent |= {"stream": True, "stream_options": {"include_usage": True}}
    if job.kind == AGENT:
        sent["tools"] = TOOLS
    return sent


def input_tokens(job: Job, messages: list[dict[str, Any]], model: str) -> int:
    """The input tokens a fake provider reports for this request: its body's bytes / 4,
    the body in httpx's compact JSON (the SDK's encoding)."""
    encoded = json.dumps(body(job, messages, model), ensure_ascii=False,
                         separators=(",", ":")).encode()
    return max(1, len(encoded) // 4)
