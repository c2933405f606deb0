"""OpenAI Responses caller → OpenAI Chat target: the request going up, the unary answer
coming back (docs/dialects.md §11). A Responses caller reaches an Anthropic target through
this bridge and then Chat → Messages (registry.py).

Stateful requests (`previous_response_id`, `conversation`) name state stored at a
Responses provider: no other API has it, so they are untranslatable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sidecar.bridge import (
    Untranslatable,
    chat_answer,
    joined_text,
    present,
    translated_tools,
)

_DROPPED = frozenset({"metadata", "store", "service_tier", "include", "truncation"})
_HANDLED = frozenset({"model", "input", "instructions", "tools", "tool_choice",
                      "parallel_tool_calls", "max_output_tokens", "temperature", "top_p",
                      "reasoning", "text", "user", "stream"})
_STATEFUL = ("previous_response_id", "conversation")


def request(body: Mapping[str, Any]) -> dict[str, Any]:
    for key in body:
        if key in _STATEFUL and body[key] is not None:
            raise Untranslatable(key, "stateful Responses requests stay on a Responses target")
        if key not in _HANDLED and key not in _DROPPED and key not in _STATEFUL:
            raise Untranslatable(key, "OpenAI Chat has no equivalent")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    messages += _items(body.get("input"))
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if isinstance(body.get("max_output_tokens"), int):
        out["max_tokens"] = body["max_output_tokens"]
    out.update(present(body, ("temperature", "top_p", "parallel_tool_calls", "user")))
    tools = translated_tools(body.get("tools"), _tool)
    if tools is not None:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _tool_choice(choice)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    if text is not None:
        _text_format(text, out)
    out["stream"] = False  # the bridged call is unary; a caller's stream is synthesized
    return out


def _items(items: object) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise Untranslatable("input", "a string or a non-empty list of items is required")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise Untranslatable(where, "not an input item")
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")),
                                 "arguments": str(item.get("arguments") or "{}")}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": _output_text(item.get("output"), f"{where}.output")})
        else:
            raise Untranslatable(f"{where}.type",
                                 f"{str(kind)[:20]!r} items are not bridged to OpenAI Chat")
    return out


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise Untranslatable(f"{where}.role", "user, assistant, system or developer")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise Untranslatable(f"{where}.content", "a string or a list of parts is required")
    if role != "user":
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in (
                    "input_text", "output_text", "text"):
                raise Untranslatable(f"{where}.content[{j}]", "only text is bridged here")
            texts.append(str(part.get("text", "")))
        return {"role": role, "content": "".join(texts)}
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise Untranslatable(f"{where}.content[{j}].type",
                                 f"{str(kind)[:20]!r} parts are not bridged to OpenAI Chat")
    return {"role": "user", "content": parts}


def _output_text(output: object, where: str) -> str:
    if isinstance(output, list):  # parts of an output (text only here)
        return joined_text([{"type": "text", "text": p.get("text")}
                            if isinstance(p, dict) and p.get("type") in ("input_text",
                                                                         "output_text")
                            else p for p in output], where, "\n", "only text is bridged")
    return joined_text(output, where, "\n", "only text is bridged")


def _tool(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise Untranslatable(where, "only function tools are bridged (no built-in tools)")
    function: dict[str, Any] = {"name": tool.get("name"),
                                "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    if choice in ("auto", "required", "none"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise Untranslatable("tool_choice", "auto, required, none or a function are bridged")


def _text_format(text: object, out: dict[str, Any]) -> None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = {"name": fmt.get("name") or "output", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            spec["strict"] = fmt["strict"]
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    else:
        raise Untranslatable("text.format", "text, json_object or json_schema")


# --- the answer ---------------------------------------------------------------------------

def response(answer: Mapping[str, Any], model: str,
             clock: Callable[[], float]) -> dict[str, Any]:
    """A Chat completion as the Responses object a Responses caller expects."""
    choice, message, calls = chat_answer(answer)
    base = str(answer.get("id", "")).removeprefix("chatcmpl-").removeprefix("chatcmpl_")
    output: list[dict[str, Any]] = []
    truncated = choice.get("finish_reason") == "length"
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{base}",
                       "status": "incomplete" if truncated and not calls else "completed",
                       "role": "assistant",
                       "content": [{"type": "output_text", "text": str(message["content"]),
                                    "annotations": []}]})
    for k, call in enumerate(calls):
        function = call["function"]
        # Cut by the output limit, the last call is the one cut: its arguments go as
        # generated (a string in both dialects), the item `incomplete`.
        cut = truncated and k == len(calls) - 1
        output.append({"type": "function_call", "id": f"fc_{base}_{k}",
                       "call_id": str(call.get("id", "")), "name": str(function.get("name")),
                       "arguments": str(function.get("arguments") or ("" if cut else "{}")),
                       "status": "incomplete" if cut else "completed"})
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    inputs, outputs = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "id": f"resp_{base}", "object": "response", "created_at": int(clock()),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "model": model, "output": output, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "error": None,
        "usage": {"input_tokens": inputs, "output_tokens": outputs,
                  "total_tokens": inputs + outputs,
                  "input_tokens_details": {"cached_tokens": cached or 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def output_text(response_object: Mapping[str, Any]) -> str:
    """The answer's text (for tests and tools)."""
    return "".join(part["text"] for item in response_object["output"]
                   if item["type"] == "message" for part in item["content"])

