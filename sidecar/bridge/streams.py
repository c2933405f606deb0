"""Streams synthesized from a unary answer, in the caller's dialect (docs/dialects.md §6).

A bridged request goes upstream unary; a caller that asked for `stream: true` gets the
answer as the full event sequence its SDK expects. The text arrives in one delta and each
tool call's arguments in one delta (there is nothing to wait for: the answer is complete),
so time to first token equals the unary latency; that is the bridged path's documented cost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def chat_sse(completion: Mapping[str, Any], include_usage: bool) -> bytes:
    """`chat.completion.chunk` events and `[DONE]` for a translated Chat completion."""
    head = {"id": completion.get("id", ""), "object": "chat.completion.chunk",
            "created": completion.get("created", 0), "model": completion.get("model", "")}
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        event = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}]}
        if include_usage:  # as OpenAI streams do when asked for their usage
            event["usage"] = None
        return event

    events = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        events.append(chunk({"content": message["content"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        events.append(chunk({"tool_calls": [{"index": index, "id": call["id"],
                                             "type": "function",
                                             "function": {"name": function["name"],
                                                          "arguments": ""}}]}))
        events.append(chunk({"tool_calls": [{"index": index, "function": {
            "arguments": function["arguments"]}}]}))
    events.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage:
        events.append({**head, "choices": [], "usage": completion.get("usage")})
    lines = [f"data: {_json(event)}\n\n" for event in events]
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def messages_sse(message: Mapping[str, Any]) -> bytes:
    """The Messages event sequence for a translated Messages answer."""
    usage = dict(message.get("usage") or {})
    start = {key: message.get(key) for key in ("id", "type", "role", "model")}
    start |= {"content": [], "stop_reason": None, "stop_sequence": None,
              "usage": {**usage, "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message.get("content") or []):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:  # tool_use
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"],
                      "input": {}}
            delta = {"type": "input_json_delta", "partial_json": _json(block["input"])}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": opened}),
            ("content_block_delta", {"type": "content_block_delta", "index": index,
                                     "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index})]
    events += [
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": message.get("stop_reason"),
                                     "stop_sequence": message.get("stop_sequence")},
                           "usage": {"output_tokens": usage.get("output_tokens", 0)}}),
        ("message_stop", {"type": "message_stop"})]
    return "".join(f"event: {name}\ndata: {_json(data)}\n\n" for name, data in events).encode()


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def responses_sse(response: Mapping[str, Any]) -> bytes:
    """The Responses event sequence for a translated Responses object: created, each output
    item opened, filled in one delta and closed, then completed."""
    events: list[dict[str, Any]] = []
    events.append({"type": "response.created",
                   "response": {**response, "status": "in_progress", "output": [],
                                "usage": None}})
    for index, item in enumerate(response.get("output") or []):
        if item["type"] == "message":
            opened = {**item, "status": "in_progress", "content": []}
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": opened})
            for part_index, part in enumerate(item["content"]):
                where = {"item_id": item["id"], "output_index": index,
                         "content_index": part_index}
                events += [
                    {"type": "response.content_part.added", **where,
                     "part": {**part, "text": ""}},
                    {"type": "response.output_text.delta", **where, "delta": part["text"],
                     "logprobs": []},
                    {"type": "response.output_text.done", **where, "text": part["text"],
                     "logprobs": []},
                    {"type": "response.content_part.done", **where, "part": part}]
        else:  # function_call
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                 "output_index": index, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", "item_id": item["id"],
                 "output_index": index, "arguments": item["arguments"]}]
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": item})
    # A response cut by its output limit ends with `response.incomplete`, as OpenAI's own
    # streams do (platform.openai.com/docs/api-reference/responses-streaming).
    ended = "incomplete" if response.get("status") == "incomplete" else "completed"
    events.append({"type": f"response.{ended}", "response": dict(response)})
    return "".join(f"event: {event['type']}\ndata: {_json({**event, 'sequence_number': n})}\n\n"
                   for n, event in enumerate(events)).encode()
