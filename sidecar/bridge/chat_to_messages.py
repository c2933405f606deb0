"""OpenAI Chat caller → Anthropic Messages target: the request going up, the unary answer
coming back (docs/dialects.md §2, §4)."""

from __future__ import annotations

import json
import re
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
from sidecar.bridge.messages_to_chat import chat_assistant_message

DEFAULT_MAX_TOKENS = 4096
THINKING_BUDGETS = {"low": 2048, "medium": 8192, "high": 16384}
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DATA_URL = re.compile(r"data:([a-z/+.-]+);base64,(.*)", re.DOTALL)
# Keys with no effect on what the model generates: dropped, and documented as such.
_DROPPED = frozenset({"metadata", "store", "service_tier", "stream_options"})
_HANDLED = frozenset({"model", "messages", "tools", "tool_choice", "parallel_tool_calls",
                      "stop", "temperature", "top_p", "max_tokens", "max_completion_tokens",
                      "reasoning_effort", "user", "stream", "n", "presence_penalty",
                      "frequency_penalty", "response_format"})
# `model_context_window_exceeded`: the answer filled the model's context window, "treat the
# response as truncated" (platform.claude.com/docs/en/build-with-claude/
# handling-stop-reasons): the provider's own limit, Chat's `length` as for `max_tokens`.
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                 "model_context_window_exceeded": "length",
                 "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}


def request(body: Mapping[str, Any]) -> dict[str, Any]:
    for key in body:
        if key not in _HANDLED and key not in _DROPPED:
            raise Untranslatable(key, "Anthropic Messages has no equivalent")
    if body.get("n", 1) != 1:
        raise Untranslatable("n", "Anthropic Messages answers one choice")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key, 0) not in (0, 0.0, None):
            raise Untranslatable(key, "Anthropic Messages has no penalties")
    system, messages = _messages(body.get("messages"))
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if system:
        out["system"] = system
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    out["max_tokens"] = max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_TOKENS
    out.update(present(body, ("temperature", "top_p")))
    if isinstance(out.get("temperature"), int | float) and out["temperature"] > 1:
        raise Untranslatable("temperature", "Anthropic Messages takes 0 to 1")
    _reasoning(body, out)
    stop = body.get("stop")
    if stop is not None:
        if not (isinstance(stop, str) or _strings(stop)):
            raise Untranslatable("stop", "a string or a list of strings is required")
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = translated_tools(body.get("tools"), _tool)
    if tools is not None:
        out["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    output = _output_format(body.get("response_format"))
    if output is not None:
        out["output_config"] = {"format": output}
    if isinstance(body.get("user"), str):
        out["metadata"] = {"user_id": body["user"]}
    out["stream"] = False  # the bridged call is unary; a caller's stream is synthesized
    return out


def _messages(messages: object) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("messages", "a non-empty list is required")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    started = False
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise Untranslatable(where, "not a message object")
        role = message.get("role")
        if role in ("system", "developer"):
            if started:
                raise Untranslatable(f"{where}.role", "Anthropic Messages has one system "
                                     "prompt, before the conversation")
            system.append(_text_only(message.get("content"), f"{where}.content"))
            continue
        started = True
        if role == "user":
            _append(out, "user", _user_blocks(message.get("content"), f"{where}.content"))
        elif role == "assistant":
            _append(out, "assistant", _assistant_blocks(message, where))
        elif role == "tool":
            _append(out, "user", [{"type": "tool_result",
                                   "tool_use_id": str(message.get("tool_call_id", "")),
                                   "content": _text_only(message.get("content"),
                                                         f"{where}.content")}])
        else:
            raise Untranslatable(f"{where}.role", f"role {str(role)[:20]!r} is not bridged")
    if not out:
        raise Untranslatable("messages", "Anthropic Messages needs a user message")
    return "\n\n".join(part for part in system if part), out


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _append(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Consecutive turns of one role become one message (Messages alternates roles)."""
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _text_only(content: object, where: str) -> str:
    return joined_text(content, where, "\n", "only text is bridged here")


def _user_blocks(content: object, where: str) -> list[dict[str, Any]]:
    return translated_parts(
        content, where, "Anthropic",
        lambda part: {"type": "text", "text": str(part.get("text", ""))},
        lambda part, path: _image(part.get("image_url"), path))


def _image(image: object, where: str) -> dict[str, Any]:
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str):
        raise Untranslatable(where, "an image URL is required")
    match = _DATA_URL.fullmatch(url)
    if match:
        if match.group(1) not in IMAGE_TYPES:
            raise Untranslatable(where, "Anthropic takes JPEG, PNG, GIF or WebP images")
        return {"type": "image", "source": {"type": "base64", "media_type": match.group(1),
                                            "data": match.group(2)}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise Untranslatable(where, "a data: URL or an http(s) URL is required")


def _assistant_blocks(message: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    text = _text_only(message.get("content"), f"{where}.content")
    if text:
        blocks.append({"type": "text", "text": text})
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise Untranslatable(f"{where}.tool_calls", "a list is required")
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise Untranslatable(f"{where}.tool_calls[{k}]", "only function calls are bridged")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            raise Untranslatable(f"{where}.tool_calls[{k}].function.arguments",
                                 "Anthropic tool input must be a JSON object")
        blocks.append({"type": "tool_use", "id": str(call.get("id", "")),
                       "name": str(function.get("name", "")), "input": arguments})
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def _tool(tool: object, where: str) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function":  # type: ignore[union-attr]
        raise Untranslatable(where, "only function tools are bridged")
    out: dict[str, Any] = {"name": function.get("name"),
                           "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: object, parallel: object) -> dict[str, Any] | None:
    out: dict[str, Any] | None
    if choice is None:
        out = None
    elif choice == "auto":
        out = {"type": "auto"}
    elif choice == "required":
        out = {"type": "any"}
    elif choice == "none":
        out = {"type": "none"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        out = {"type": "tool", "name": choice["function"].get("name")}
    else:
        raise Untranslatable("tool_choice", "not a tool choice Anthropic can express")
    if parallel is False:
        out = {"type": "auto"} if out is None else out
        if out["type"] != "none":
            out["disable_parallel_tool_use"] = True
    return out


def _output_format(response_format: object) -> dict[str, Any] | None:
    """A JSON schema crosses as Anthropic's `output_config.format`; JSON mode without a
    schema has no Anthropic form."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = response_format.get("json_schema")  # type: ignore[union-attr]
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            return {"type": "json_schema", "schema": schema}
        raise Untranslatable("response_format.json_schema.schema", "a schema object is required")
    raise Untranslatable("response_format", "Anthropic has JSON schemas, not JSON mode")


def _reasoning(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    effort = body.get("reasoning_effort")
    if effort in (None, "none", "minimal"):
        return
    if effort not in THINKING_BUDGETS:
        raise Untranslatable("reasoning_effort", "low, medium or high are bridged")
    if "temperature" in out or "top_p" in out:
        raise Untranslatable("reasoning_effort", "Anthropic thinking needs the default "
                             "temperature and top_p")
    budget = THINKING_BUDGETS[effort]
    out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    out["max_tokens"] += budget  # thinking counts against max_tokens there


# --- the answer ---------------------------------------------------------------------------

def response(answer: Mapping[str, Any], model: str,
             clock: Callable[[], float]) -> dict[str, Any]:
    """A Messages answer as the Chat completion a Chat caller expects."""
    blocks = answer.get("content")
    if not isinstance(blocks, list):
        raise UnreadableAnswer("the Anthropic answer has no content list")
    message = chat_assistant_message(blocks, lambda _index, _kind: None)
    return {
        "id": str(answer.get("id", "")), "object": "chat.completion",
        "created": int(clock()), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": _STOP_REASONS.get(str(answer.get("stop_reason")),
                                                        "stop")}],
        "usage": chat_usage(answer.get("usage")),
    }


def chat_usage(usage: object) -> dict[str, Any]:
    """Anthropic's usage as Chat counts it: cache reads and writes inside `prompt_tokens`.
    Chat has no field for cache writes, so the gateway names them in
    `prompt_tokens_details.cache_write_tokens` (SDKs keep unknown fields), which telemetry
    prices apart (observe/usage_fields.py)."""
    usage = usage if isinstance(usage, dict) else {}
    cached = _count(usage, "cache_read_input_tokens")
    written = _count(usage, "cache_creation_input_tokens")
    prompt = _count(usage, "input_tokens") + cached + written
    completion = _count(usage, "output_tokens")
    details: dict[str, int] = {"cached_tokens": cached}
    if written:
        details["cache_write_tokens"] = written
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": details}


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
