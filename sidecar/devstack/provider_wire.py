"""Provider-side wire formats for the demo providers: OpenAI Chat and Anthropic Messages,
as JSON bodies and as SSE event sequences, and OpenAI Responses (JSON), shaped like the real
APIs so the official SDKs parse them; their error bodies and in-band stream errors. Each
shape follows the provider's public API reference, named where it is built. Deterministic
text: "Hello from <provider> serving <model>." split into words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.bridge.cut_arguments import cut_tool_input
from sidecar.observe.refusal_catalogue import examples

_CREATED = 1_700_000_000


@dataclass(frozen=True)
class Completion:
    """What a demo provider answers: words of text, token counts, and why it stopped."""

    id: str
    model: str
    words: tuple[str, ...]
    prompt_tokens: int
    truncated: bool
    # (tool name, JSON arguments) when the demo answers with a tool call instead of text
    tool_call: tuple[str, str] | None = None
    # Prompt caching: input tokens read from the provider's cache, and (Anthropic) written
    # to it; both are part of `prompt_tokens`, the request's whole input.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # A tool call cut by the cap (`cut_tool_calls`): the tokens its arguments had used.
    call_tokens: int = 0

    @property
    def text(self) -> str:
        return "".join(self.words)

    @property
    def completion_tokens(self) -> int:
        return len(self.words) + self.call_tokens


def make_completion(request_id: str, provider: str, request: dict[str, Any], body_size: int,
                    text: str | None = None, call_tools: bool = False,
                    cache: tuple[int, int] = (0, 0), cut_tool_calls: bool = False) -> Completion:
    """`cache`: (read, written) prompt-cache tokens, within the prompt's size.
    `cut_tool_calls`: a tool call obeys the cap as an engine does (a token per character
    of its arguments): cut there, it stops with the dialect's max-tokens reason and its
    arguments as far as they went (`{"city": "Oslo", "da`)."""
    model = str(request.get("model", ""))
    text = text or f"Hello from {provider} serving {model}. This is a demo completion."
    pieces = text.split(" ")
    words = [piece + " " for piece in pieces[:-1]] + [pieces[-1]]
    cap = request.get("max_completion_tokens") or request.get("max_tokens")
    truncated = isinstance(cap, int) and 0 < cap < len(words)
    if truncated:
        words = words[:cap]
    call = _tool_call(request) if call_tools else None
    call_tokens = 0
    if call is not None:
        words, truncated = ["Calling ", "a ", "tool."], False
        if cut_tool_calls and isinstance(cap, int) and cap < len(words) + len(call[1]):
            call_tokens = max(0, cap - len(words))
            call, truncated = (call[0], call[1][:call_tokens]), True
    prompt_tokens = max(1, body_size // 4, sum(cache))
    return Completion(request_id, model, tuple(words), prompt_tokens, truncated, call, *cache,
                      call_tokens=call_tokens)


def prompt_tokens(body_size: int) -> int:
    """The demo's token count of a request body (about four bytes a token)."""
    return max(1, body_size // 4)


def _tool_call(request: dict[str, Any]) -> tuple[str, str] | None:
    """The demo's tool policy: call the first tool, unless the conversation just brought a
    tool's result back (then answer in text)."""
    tools = request.get("tools")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    messages = request.get("messages") if isinstance(request.get("messages"), list) else []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    content = last.get("content")
    if last.get("role") == "tool" or (isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content)):
        return None
    tool = tools[0]
    name = tool.get("name") or (tool.get("function") or {}).get("name") or "tool"
    return str(name), json.dumps({"city": "Oslo", "days": 2})


def _data(payload: dict[str, Any], spaced: bool = False) -> bytes:
    """One SSE event; `spaced`: JSON as Python's `json.dumps` writes it by default (`", "`
    and `": "`), as several Python-written OpenAI-compatible servers send it."""
    text = json.dumps(payload) if spaced else json.dumps(payload, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\n".encode() + _data(payload)


# --- OpenAI Chat -----------------------------------------------------------------------------

def openai_usage(c: Completion) -> dict[str, Any]:
    """Chat usage (platform.openai.com/docs/api-reference/chat/object, `usage`): cached
    tokens are counted inside `prompt_tokens` and named again in
    `prompt_tokens_details.cached_tokens` (platform.openai.com/docs/guides/prompt-caching).
    OpenAI bills no cache writes."""
    usage: dict[str, Any] = {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }
    if c.cache_read_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": c.cache_read_tokens}
    return usage


def _call_id(c: Completion) -> str:
    return "call_" + c.id.rsplit("_", 1)[-1]


def _finish(c: Completion) -> str:
    # platform.openai.com/docs/api-reference/chat/object: `length` when the cap was hit,
    # a tool call cut there included (its `arguments` then end where the output did).
    return "length" if c.truncated else "tool_calls" if c.tool_call else "stop"


def openai_json(c: Completion, usage: bool = True) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.tool_call:
        message["tool_calls"] = [{"id": _call_id(c), "type": "function", "function": {
            "name": c.tool_call[0], "arguments": c.tool_call[1]}}]
    return json.dumps({
        "id": c.id,
        "object": "chat.completion",
        "created": _CREATED,
        "model": c.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(c)}],
        **({"usage": openai_usage(c)} if usage else {}),
    }).encode()


def llama_cpp_timings(c: Completion) -> dict[str, Any]:
    """llama.cpp server's `timings` object (tools/server/README.md, the completion reply's
    `timings`; server-task.cpp `result_timings::to_json`): prompt and generation counts and
    durations. The fake's figures are made up from the token counts."""
    prompt_ms, predicted_ms = 0.5 * c.prompt_tokens, 2.0 * c.completion_tokens
    return {"cache_n": 0, "prompt_n": c.prompt_tokens, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": 0.5, "prompt_per_second": 2000.0,
            "predicted_n": c.completion_tokens, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": 2.0, "predicted_per_second": 500.0}


def openai_events(c: Completion, include_usage: bool, spaced: bool = False,
                  timings: bool = False) -> Iterator[bytes]:
    """platform.openai.com/docs/api-reference/chat/create, `stream_options.include_usage`:
    a last chunk with empty `choices` and the usage before `[DONE]`, and `"usage": null`
    in every other chunk. `spaced`: JSON with Python's default separators. `timings`: as
    llama.cpp's server, a `timings` object on the stream's last chunk, which is the usage
    chunk when usage is asked (server-task.cpp, `to_json_oaicompat_chat_stream`:
    `deltas.back()` gets the timings after the usage chunk is appended)."""
    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        event: dict[str, Any] = {
            "id": c.id, "object": "chat.completion.chunk", "created": _CREATED, "model": c.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if include_usage:
            event["usage"] = None
        return event

    yield _data(chunk({"role": "assistant", "content": ""}, None), spaced)
    for word in c.words:
        yield _data(chunk({"content": word}, None), spaced)
    if c.tool_call:
        name, arguments = c.tool_call
        half = len(arguments) // 2
        yield _data(chunk({"tool_calls": [{"index": 0, "id": _call_id(c), "type": "function",
                                           "function": {"name": name, "arguments": ""}}]},
                          None), spaced)
        for piece in (arguments[:half], arguments[half:]):
            yield _data(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]},
                              None), spaced)
    final = chunk({}, _finish(c))
    last: dict[str, Any] = final
    if include_usage:
        last = {"id": c.id, "object": "chat.completion.chunk", "created": _CREATED,
                "model": c.model, "choices": [], "usage": openai_usage(c)}
    if timings:
        last["timings"] = llama_cpp_timings(c)
    yield _data(final, spaced)
    if include_usage:
        yield _data(last, spaced)
    yield b"data: [DONE]\n\n"


def responses_json(c: Completion) -> bytes:
    """OpenAI Responses API reply (non-streaming)."""
    return json.dumps({
        "id": c.id.replace("chatcmpl", "resp"),
        "object": "response",
        "created_at": _CREATED,
        "status": "incomplete" if c.truncated else "completed",
        "model": c.model,
        "output": [{
            "type": "message", "id": "msg_" + c.id, "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": c.text, "annotations": []}],
        }],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
                  "total_tokens": c.prompt_tokens + c.completion_tokens},
    }).encode()


def openai_error(status: int, message: str, code: str | None = None,
                 param: str | None = None) -> bytes:
    """platform.openai.com/docs/guides/error-codes: `{"error": {message, type, param, code}}`
    (a 429's code is `rate_limit_exceeded`)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    if status == 429:
        kind, code = "requests", code or "rate_limit_exceeded"
    return json.dumps({"error": {"message": message, "type": kind, "param": param,
                                 "code": code}}).encode()


def catalogue_refusal(provider: str) -> tuple[int, bytes]:
    """The status and body `provider` sends a prompt over its context window, as the
    refusal catalogue has it (observe/refusal_catalogue.py names each one's source)."""
    entry = examples(provider)[0]
    return entry.status, entry.example_bytes(spaced=True)


def openai_context_error(window: int, requested: int) -> bytes:
    """The 400 OpenAI answers a prompt its model cannot hold (the catalogue's entry)."""
    return catalogue_refusal("openai")[1]


def vllm_context_error(window: int, requested: int) -> bytes:
    """vLLM's OpenAI-compatible server: an `ErrorResponse` object, not OpenAI's
    `{"error": …}` envelope (the catalogue's entry)."""
    return catalogue_refusal("vllm")[1]


def openai_stream_error(message: str, kind: str = "server_error") -> bytes:
    """An error sent as a Chat stream's data line after a 200 (the OpenAI SDKs raise
    `APIError` for a chunk with an `error` object)."""
    return _data({"error": {"message": message, "type": kind, "param": None, "code": None}})


# --- Anthropic Messages ----------------------------------------------------------------------

def _stop_reason(c: Completion) -> str:
    return "max_tokens" if c.truncated else "tool_use" if c.tool_call else "end_turn"


def _anthropic_content(c: Completion) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": c.text}]
    if c.tool_call:
        content.append({"type": "tool_use", "id": "toolu_" + c.id.rsplit("_", 1)[-1],
                        "name": c.tool_call[0], "input": cut_tool_input(c.tool_call[1])})
    return content


def anthropic_json(c: Completion) -> bytes:
    return json.dumps({
        "id": c.id,
        "type": "message",
        "role": "assistant",
        "model": c.model,
        "content": _anthropic_content(c),
        "stop_reason": _stop_reason(c),
        "stop_sequence": None,
        "usage": {**anthropic_input_usage(c), "output_tokens": c.completion_tokens},
    }).encode()


def anthropic_input_usage(c: Completion) -> dict[str, int]:
    """docs.anthropic.com/en/docs/build-with-claude/prompt-caching: `input_tokens` counts only
    the tokens after the last cache breakpoint; cache reads and writes are reported beside
    it, not inside it."""
    return {"input_tokens": c.prompt_tokens - c.cache_read_tokens - c.cache_write_tokens,
            "cache_creation_input_tokens": c.cache_write_tokens,
            "cache_read_input_tokens": c.cache_read_tokens}


def anthropic_events(c: Completion) -> Iterator[bytes]:
    yield _event("message_start", {"type": "message_start", "message": {
        "id": c.id, "type": "message", "role": "assistant", "model": c.model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {**anthropic_input_usage(c), "output_tokens": 1},
    }})
    yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}})
    yield _event("ping", {"type": "ping"})
    for word in c.words:
        yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": word}})
    yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
    if c.tool_call:
        block = _anthropic_content(c)[1]
        arguments = c.tool_call[1]
        half = len(arguments) // 2
        yield _event("content_block_start", {"type": "content_block_start", "index": 1,
                                             "content_block": {**block, "input": {}}})
        for piece in (arguments[:half], arguments[half:]):
            yield _event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                                 "delta": {"type": "input_json_delta",
                                                           "partial_json": piece}})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 1})
    yield _event("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": _stop_reason(c), "stop_sequence": None},
        "usage": {"output_tokens": c.completion_tokens},
    })
    yield _event("message_stop", {"type": "message_stop"})


_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                          404: "not_found_error", 429: "rate_limit_error",
                          529: "overloaded_error"}


def anthropic_error(status: int, message: str) -> bytes:
    """docs.anthropic.com/en/api/errors: `{"type": "error", "error": {type, message}}`."""
    kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def anthropic_context_error(window: int, requested: int) -> bytes:
    """The 400 Anthropic answers a prompt over the model's context window (the
    catalogue's entry)."""
    return catalogue_refusal("anthropic")[1]


def anthropic_stream_error(kind: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    """docs.anthropic.com/en/api/messages-streaming, "Error events": after a 200, an
    overloaded API sends `event: error` with an `overloaded_error`, and the stream ends."""
    return _event("error", {"type": "error", "error": {"type": kind, "message": message}})
