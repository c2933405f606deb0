"""OpenAI Chat caller → OpenAI Responses target, for stateful sessions (docs/dialects.md
§13): the request going up (with the session's `previous_response_id`), the unary answer
coming back as a Chat completion.

A Chat caller resends the whole conversation each turn; a Responses provider that holds the
previous response needs only what came after it. So with a `previous_response_id`, only the
turns after the conversation's last assistant message go up.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.bridge import (
    UnreadableAnswer,
    Untranslatable,
    joined_text,
    present,
    translated_parts,
    translated_tools,
)

_DROPPED = frozenset({"metadata", "store", "service_tier", "stream_options"})
_HANDLED = frozenset({"model", "messages", "tools", "tool_choice", "parallel_tool_calls",
                      "temperature", "top_p", "max_tokens", "max_completion_tokens",
                      "reasoning_effort", "user", "stream", "response_format", "n"})


def request(body: Mapping[str, Any], previous_response_id: str | None) -> dict[str, Any]:
    for key in body:
        if key not in _HANDLED and key not in _DROPPED:
            raise Untranslatable(key, "OpenAI Responses has no equivalent")
    if body.get("n", 1) != 1:
        raise Untranslatable("n", "OpenAI Responses answers one choice")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("messages", "a non-empty list is required")
    if previous_response_id is not None:
        last = max((i for i, m in enumerate(messages)
                    if isinstance(m, dict) and m.get("role") == "assistant"), default=-1)
        messages = messages[last + 1:]
        if not messages:
            raise Untranslatable("messages", "a session turn needs something after the "
                                 "last assistant message")
    instructions, items = _items(messages)
    out: dict[str, Any] = {"model": body.get("model"), "input": items, "stream": False}
    if instructions:
        out["instructions"] = instructions
    if previous_response_id is not None:
        out["previous_response_id"] = previous_response_id
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(cap, int):
        out["max_output_tokens"] = cap
    out.update(present(body, ("temperature", "top_p", "parallel_tool_calls", "user")))
    if body.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    tools = translated_tools(body.get("tools"), _tool)
    if tools is not None:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _tool_choice(choice)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        spec = fmt.get("json_schema") if isinstance(fmt.get("json_schema"), dict) else {}
        out["text"] = {"format": {"type": fmt["type"], **spec}}
    return out


def _items(messages: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise Untranslatable(where, "not a message object")
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(joined_text(message.get("content"), f"{where}.content", "\n",
                                      "only text is bridged here"))
        elif role == "user":
            items.append({"role": "user", "content": _parts(message.get("content"),
                                                             f"{where}.content")})
        elif role == "assistant":
            text = joined_text(message.get("content"), f"{where}.content", "\n",
                               "only text is bridged here")
            if text:
                items.append({"role": "assistant", "content": text})
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict):
                    raise Untranslatable(f"{where}.tool_calls", "only function calls")
                items.append({"type": "function_call", "call_id": str(call.get("id", "")),
                              "name": str(function.get("name", "")),
                              "arguments": str(function.get("arguments") or "{}")})
        elif role == "tool":
            items.append({"type": "function_call_output",
                          "call_id": str(message.get("tool_call_id", "")),
                          "output": joined_text(message.get("content"), f"{where}.content",
                                                "\n", "only text is bridged here")})
        else:
            raise Untranslatable(f"{where}.role", f"role {str(role)[:20]!r} is not bridged")
    return "\n\n".join(part for part in system if part), items


def _parts(content: object, where: str) -> object:
    if isinstance(content, str):
        return content
    return translated_parts(
        content, where, "OpenAI Responses",
        lambda part: {"type": "input_text", "text": str(part.get("text", ""))},
        _input_image)


def _input_image(part: dict[str, Any], where: str) -> dict[str, Any]:
    image = part.get("image_url")
    if not isinstance(image, dict):
        raise Untranslatable(where, "an object with a url is required")
    return {"type": "input_image", "image_url": str(image.get("url"))}


def _tool(tool: object, where: str) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        raise Untranslatable(where, "only function tools are bridged")
    out = {"type": "function", "name": function.get("name"),
           "parameters": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: object) -> object:
    if choice in ("auto", "required", "none"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "function", "name": choice["function"].get("name")}
    raise Untranslatable("tool_choice", "not a tool choice OpenAI Responses can express")


# --- the answer ---------------------------------------------------------------------------

def response(answer: Mapping[str, Any], model: str,
             clock: Callable[[], float]) -> dict[str, Any]:
    """A Responses object as the Chat completion a Chat caller expects."""
    output = answer.get("output")
    if not isinstance(output, list):
        raise UnreadableAnswer("the Responses answer has no output list")
    texts, calls = [], []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text", "")))
        elif item.get("type") == "function_call":
            calls.append({"id": str(item.get("call_id", "")), "type": "function",
                          "function": {"name": str(item.get("name", "")),
                                       "arguments": str(item.get("arguments") or "{}")}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    # Cut by the output limit (`max_output_tokens`) is Chat's "length" even with a call in
    # it, as Chat itself answers; the call's arguments go as far as they were generated.
    # Cut by the provider's filter (`incomplete_details.reason: content_filter`), Chat's
    # `content_filter`.
    finish = "tool_calls" if calls else "stop"
    if answer.get("status") == "incomplete":
        details = answer.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        finish = "content_filter" if reason == "content_filter" else "length"
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    inputs = usage.get("input_tokens") if isinstance(usage.get("input_tokens"), int) else 0
    outputs = usage.get("output_tokens") if isinstance(usage.get("output_tokens"), int) else 0
    return {
        "id": str(answer.get("id", "")), "object": "chat.completion",
        "created": int(clock()), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": inputs, "completion_tokens": outputs,
                  "total_tokens": inputs + outputs},
    }


def response_id(answer: bytes) -> str | None:
    """The id of a Responses answer, to thread the next turn of its session."""
    try:
        document = json.loads(answer)
    except (ValueError, RecursionError):
        return None
    value = document.get("id") if isinstance(document, dict) else None
    return value if isinstance(value, str) and value else None
