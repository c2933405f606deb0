"""Anthropic Messages caller → OpenAI Chat target: the request going up, the unary answer
coming back (docs/dialects.md §3, §4)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.bridge import (
    UnreadableAnswer,
    Untranslatable,
    chat_answer,
    joined_text,
    present,
    translated_tools,
)
from sidecar.bridge.cut_arguments import cut_tool_input

MAX_STOPS = 4  # Chat's limit on stop sequences
_HANDLED = frozenset({"model", "system", "messages", "max_tokens", "tools", "tool_choice",
                      "stop_sequences", "temperature", "top_p", "thinking", "metadata",
                      "stream", "output_config", "output_format"})
_EFFORTS = ("low", "medium", "high")
_FINISH_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "function_call": "tool_use", "content_filter": "refusal"}


def request(body: Mapping[str, Any]) -> dict[str, Any]:
    for key in body:
        if key not in _HANDLED:
            raise Untranslatable(key, "OpenAI Chat has no equivalent")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _system_text(system)})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise Untranslatable("messages", "a non-empty list is required")
    for i, turn in enumerate(turns):
        messages.extend(_turn(turn, f"messages[{i}]"))
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if isinstance(body.get("max_tokens"), int):
        out["max_tokens"] = body["max_tokens"]
    out.update(present(body, ("temperature", "top_p")))
    stops = body.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise Untranslatable("stop_sequences", "a list of strings is required")
        if len(stops) > MAX_STOPS:
            raise Untranslatable("stop_sequences", f"OpenAI Chat takes at most {MAX_STOPS}")
        out["stop"] = list(stops)
    tools = translated_tools(body.get("tools"), _tool)
    if tools is not None:
        out["tools"] = tools
    _tool_choice(body.get("tool_choice"), out)
    _thinking(body.get("thinking"), out)
    _output_config(body, out)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        out["user"] = metadata["user_id"]
    out["stream"] = False  # the bridged call is unary; a caller's stream is synthesized
    return out


def _system_text(system: object) -> str:
    return joined_text(system, "system", "\n\n", "only text system blocks are bridged")


def _turn(turn: object, where: str) -> list[dict[str, Any]]:
    if not isinstance(turn, dict):
        raise Untranslatable(where, "not a message object")
    role, content = turn.get("role"), turn.get("content")
    if role not in ("user", "assistant"):
        raise Untranslatable(f"{where}.role", "user or assistant is required")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise Untranslatable(f"{where}.content", "a string or a list of blocks is required")
    if role == "assistant":
        return [_assistant(content, where)]
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            tool_messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                                  "content": _tool_result_text(block, at)})
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        else:
            raise Untranslatable(f"{at}.type",
                                 f"{str(kind)[:20]!r} blocks are not bridged to OpenAI Chat")
    # Chat wants the tool results right after the assistant's calls, then the rest.
    return tool_messages + ([{"role": "user", "content": parts}] if parts else [])


def _tool_result_text(block: Mapping[str, Any], where: str) -> str:
    text = joined_text(block.get("content"), f"{where}.content", "\n",
                       "only text tool results are bridged to OpenAI Chat")
    return f"Error: {text}" if block.get("is_error") is True else text


def _image_url(block: Mapping[str, Any], where: str) -> str:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if isinstance(source, dict) and source.get("type") == "url":
        return str(source.get("url"))
    raise Untranslatable(f"{where}.source", "a base64 or url image source is required")


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    def refuse(j: int, kind: object) -> None:
        raise Untranslatable(f"{where}.content[{j}].type",
                             f"{str(kind)[:20]!r} blocks are not bridged to OpenAI Chat")

    return chat_assistant_message(blocks, refuse)


def chat_assistant_message(blocks: list[Any],
                           unknown: Callable[[int, object], None]) -> dict[str, Any]:
    """Anthropic assistant blocks as one Chat assistant message: text joined, `tool_use` as
    tool calls, thinking dropped (Chat has no place for it); `unknown(index, type)` decides
    about any other block (a request refuses it, an answer skips it)."""
    texts, calls = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": str(block.get("name", "")),
                                       "arguments": json.dumps(block.get("input") or {})}})
        elif kind not in ("thinking", "redacted_thinking"):
            unknown(j, kind)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        raise Untranslatable(where, "Anthropic server tools are not bridged")
    function: dict[str, Any] = {"name": tool.get("name"),
                                "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object, out: dict[str, Any]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise Untranslatable("tool_choice", "an object is required")
    kind = choice.get("type")
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise Untranslatable("tool_choice.type", "auto, any, tool or none are bridged")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def _output_config(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    """`output_config.format` (or the beta `output_format`) becomes a JSON-schema
    `response_format`; `output_config.effort` low/medium/high becomes `reasoning_effort`."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise Untranslatable("output_config", "an object is required")
    config = config or {}
    for key in config:
        if key not in ("format", "effort"):
            raise Untranslatable(f"output_config.{key}"[:120], "OpenAI Chat has no equivalent")
    output = config.get("format") or body.get("output_format")
    if output is not None:
        schema = output.get("schema") if isinstance(output, dict) else None
        if not isinstance(output, dict) or output.get("type") != "json_schema" or not (
                isinstance(schema, dict)):
            raise Untranslatable("output_config.format", "a json_schema with a schema object "
                                 "is required")
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "output", "schema": schema}}
    effort = config.get("effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise Untranslatable("output_config.effort", "low, medium or high are bridged")
        out["reasoning_effort"] = effort


def _thinking(thinking: object, out: dict[str, Any]) -> None:
    if thinking is None:
        return
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
        raise Untranslatable("thinking", "enabled or disabled is required")
    if thinking["type"] == "disabled":
        return
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int):
        raise Untranslatable("thinking.budget_tokens", "a number of tokens is required")
    out["reasoning_effort"] = "low" if budget < 4096 else "medium" if budget < 16384 else "high"


# --- the answer ---------------------------------------------------------------------------

def response(answer: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A Chat completion as the Messages answer a Messages caller expects."""
    choice, message, calls = chat_answer(answer)
    # Cut by the output limit: an answer, not a failure; a tool call's arguments may be
    # cut mid-JSON, and carry what was complete (cut_arguments.py, docs/dialects.md §4).
    cut = choice.get("finish_reason") == "length"
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": str(message["content"])})
    for call in calls:
        function = call["function"]
        if cut:
            arguments = cut_tool_input(function.get("arguments"))
        else:
            arguments = _whole_arguments(function.get("arguments"))
        blocks.append({"type": "tool_use", "id": str(call.get("id", "")),
                       "name": str(function.get("name", "")), "input": arguments})
    return {
        "id": str(answer.get("id", "")), "type": "message", "role": "assistant",
        "model": model, "content": blocks,
        "stop_reason": _FINISH_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": messages_usage(answer.get("usage")),
    }


def _whole_arguments(arguments: Any) -> dict[str, Any]:
    """A finished tool call's arguments: a JSON object, or the answer is not one."""
    try:
        parsed = json.loads(arguments or "{}")
    except (TypeError, ValueError, RecursionError):
        raise UnreadableAnswer("tool call arguments that are not JSON") from None
    if not isinstance(parsed, dict):
        raise UnreadableAnswer("tool call arguments that are not a JSON object")
    return parsed


def messages_usage(usage: object) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else 0
    prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else 0
    output = (usage.get("completion_tokens")
              if isinstance(usage.get("completion_tokens"), int) else 0)
    return {"input_tokens": max(0, prompt - cached), "cache_read_input_tokens": cached,
            "output_tokens": output}
