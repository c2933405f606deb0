"""What a mirrored request's answer says, read by the sidecar (it sent the request, so
reading the answer costs the live path nothing): tokens, how it finished, the tools it
called and whether their arguments parse, and whether its text parses as JSON — the
agreement figures that need no judge. Safe scalars only: no text of the answer is kept.

Provider bytes are arbitrary (JSON whitespace, key order, SSE framing split anywhere): the
answer is read as JSON, and an SSE stream as its `data:` lines (the WHATWG event-stream
format; OpenAI's chat-streaming and Anthropic's streaming-messages references give the
events read here). Anything unreadable is a figure left None, never an exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.dialects.apis import Dialect

# Finish classes across dialects (OpenAI `finish_reason`, Anthropic `stop_reason`).
_FINISH = {"stop": "stop", "end_turn": "stop", "stop_sequence": "stop",
           "length": "length", "max_tokens": "length",
           "tool_calls": "tool", "function_call": "tool", "tool_use": "tool",
           "content_filter": "filter", "refusal": "filter"}
MAX_TOOLS = 16   # tool calls read per answer; the rest are ignored
UNDECLARED = "(undeclared)"   # a call to a tool the request did not declare


def finish_class(reason: object) -> str | None:
    """A finish reason of either dialect as its class (stop, length, tool, filter, other)."""
    if not isinstance(reason, str) or not reason:
        return None
    return _FINISH.get(reason, "other")


def kept_tools(names: list[str], declared: frozenset[str]) -> list[str]:
    """`names` as a row may hold them: declared ones, UNDECLARED for the rest."""
    return [name if name in declared else UNDECLARED for name in names[:MAX_TOOLS]]


def declared_tools(payload: Mapping[str, object]) -> frozenset[str]:
    """The names of the tools a request declares (OpenAI Chat `tools[].function.name`,
    Anthropic `tools[].name`): the only tool names a mirror row may hold."""
    tools = payload.get("tools")
    names = set()
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            function = tool.get("function")
            name = function.get("name") if isinstance(function, dict) else tool.get("name")
            if isinstance(name, str) and len(name) <= 64:
                names.add(name)
    return frozenset(names)


@dataclass(slots=True)
class MirrorAnswer:
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish: str | None = None                  # stop, length, tool, filter, other
    tool_names: list[str] = field(default_factory=list)
    tool_arguments_valid: bool | None = None   # every call's arguments parse (None: no call)
    json_valid: bool | None = None             # the text parses as JSON (when asked)
    _declared: frozenset[str] = field(default=frozenset(), repr=False)
    _text: list[str] = field(default_factory=list, repr=False)
    _arguments: dict[int, list[str]] = field(default_factory=dict, repr=False)

    def finish_with(self, reason: object) -> None:
        found = finish_class(reason)
        if found is not None:
            self.finish = found

    def tool(self, index: object, name: object) -> None:
        """A call's name is kept only when the request declared that tool (else
        UNDECLARED): what the candidate writes there is its own text."""
        if (isinstance(name, str) and name and isinstance(index, int)
                and len(self.tool_names) < MAX_TOOLS):
            self.tool_names.append(name if name in self._declared else UNDECLARED)
            self._arguments.setdefault(index, [])

    def arguments(self, index: object, text: object) -> None:
        if isinstance(text, str) and isinstance(index, int) and index in self._arguments:
            self._arguments[index].append(text)

    def close(self, wants_json: bool) -> MirrorAnswer:
        if self._arguments:
            self.tool_arguments_valid = all(_parses("".join(parts) or "{}")
                                            for parts in self._arguments.values())
        if wants_json:
            self.json_valid = _parses("".join(self._text))
        self._text, self._arguments = [], {}
        return self


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def read_answer(body: bytes, stream: bool, dialect: Dialect, wants_json: bool,
                declared: frozenset[str] = frozenset()) -> MirrorAnswer:
    """`body`: the whole answer (bounded by the reader); `stream`: an SSE answer;
    `declared`: the request's tool names (declared_tools)."""
    answer = MirrorAnswer(_declared=declared)
    documents = _events(body) if stream else [_document(body)]
    read = _read_messages if dialect.is_anthropic else _read_chat
    for document in documents:
        if isinstance(document, dict):
            read(answer, document)
    return answer.close(wants_json)


def _document(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _events(body: bytes) -> list[Any]:
    events = []
    for line in body.splitlines():
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                events.append(_document(data))
    return events


def _read_chat(answer: MirrorAnswer, document: dict) -> None:
    """An OpenAI Chat completion, or one chunk of its stream."""
    usage = document.get("usage")
    if isinstance(usage, dict):
        answer.input_tokens = _int(usage.get("prompt_tokens"))
        answer.output_tokens = _int(usage.get("completion_tokens"))
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    answer.finish_with(choice.get("finish_reason"))
    message = choice.get("message") or choice.get("delta")
    if not isinstance(message, dict):
        return
    if isinstance(message.get("content"), str):
        answer._text.append(message["content"])
    calls = message.get("tool_calls")
    for position, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, dict):
            continue
        index = call.get("index", position)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if "name" in function:
            answer.tool(index, function.get("name"))
        answer.arguments(index, function.get("arguments"))


def _read_messages(answer: MirrorAnswer, document: dict) -> None:
    """An Anthropic message, or one event of its stream."""
    kind = document.get("type")
    if kind == "message_start":
        document = document.get("message") if isinstance(document.get("message"), dict) else {}
        kind = "message"
    usage = document.get("usage")
    if isinstance(usage, dict):
        if _int(usage.get("input_tokens")) is not None:
            answer.input_tokens = _int(usage.get("input_tokens"))
        if _int(usage.get("output_tokens")) is not None:
            answer.output_tokens = _int(usage.get("output_tokens"))
    if kind == "message":
        answer.finish_with(document.get("stop_reason"))
        blocks = document.get("content")
        for index, block in enumerate(blocks if isinstance(blocks, list) else []):
            _block(answer, index, block, whole=True)
    elif kind == "message_delta":
        delta = document.get("delta")
        if isinstance(delta, dict):
            answer.finish_with(delta.get("stop_reason"))
    elif kind == "content_block_start":
        _block(answer, document.get("index", 0), document.get("content_block"), whole=False)
    elif kind == "content_block_delta":
        delta = document.get("delta")
        if isinstance(delta, dict):
            if delta.get("type") == "text_delta":
                answer._text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta":
                answer.arguments(document.get("index", 0), delta.get("partial_json"))


def _block(answer: MirrorAnswer, index: object, block: object, whole: bool) -> None:
    if not isinstance(block, dict) or not isinstance(index, int):
        return
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        answer._text.append(block["text"])
    elif block.get("type") == "tool_use":
        answer.tool(index, block.get("name"))
        if whole:  # a whole message's tool input is already an object
            answer.arguments(index, json.dumps(block.get("input", {})))
