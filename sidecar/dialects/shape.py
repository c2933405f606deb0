"""Read a request body's shape for routing: tools, images, reasoning, output cap, prompt size
and a bounded prompt sample, for each caller dialect.

Bodies come from callers, so nothing here trusts a type: every access checks what it got and
an odd shape simply counts as absent. Work is bounded: sizes are summed with `len`, and at
most `scan_limit` characters of text are copied (newest message first, where the task is).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.dialects.apis import Dialect
from sidecar.routing.request import DEFAULT_OUTPUT_TOKENS, Reasoning, RequestSummary

_IMAGE_PARTS = {"image_url", "image", "input_image"}
_TEXT_PARTS = {"text", "input_text", "output_text"}
# The output formats that constrain a reply (`text` does not): what `structured_output`
# can hold, and so what routing, traces and the external routing API can name.
STRUCTURED_OUTPUT_KINDS = ("json_object", "json_schema")


@dataclass(frozen=True, slots=True)
class RequestShape:
    stream: bool
    has_tools: bool
    tool_forced: bool
    has_images: bool
    reasoning: Reasoning | None
    max_tokens_cap: int | None
    prompt_chars: int
    prompt_sample: str
    # `json_object` or `json_schema` when the caller asked for structured output
    structured_output: str | None = None

    def summary(self, group: str, caller: str, dialect: Dialect,
                spend_ceiling_usd: float | None = None,
                conversation_key: bytes | None = None,
                bridge_refusal: str | None = None,
                default_output_tokens: int = DEFAULT_OUTPUT_TOKENS,
                budget_pressure: float = 0.0) -> RequestSummary:
        """What the routing core gets: this shape plus who asked for which group."""
        return RequestSummary(
            group=group, caller=caller, dialect=dialect, stream=self.stream,
            has_tools=self.has_tools, tool_forced=self.tool_forced, has_images=self.has_images,
            reasoning=self.reasoning, max_tokens_cap=self.max_tokens_cap,
            prompt_chars=self.prompt_chars, prompt_sample=self.prompt_sample,
            spend_ceiling_usd=spend_ceiling_usd, conversation_key=conversation_key,
            structured_output=self.structured_output, bridge_refusal=bridge_refusal,
            default_output_tokens=default_output_tokens, budget_pressure=budget_pressure,
        )


def request_shape(dialect: Dialect, payload: dict[str, Any], scan_limit: int) -> RequestShape:
    if dialect is Dialect.ANTHROPIC_MESSAGES:
        turns = _anthropic_turns(payload)
        reasoning = _anthropic_thinking(payload.get("thinking"))
        cap = _positive_int(payload.get("max_tokens"))
        forced = _dict(payload.get("tool_choice")).get("type") in ("any", "tool")
        output = (_dict(_dict(payload.get("output_config")).get("format"))
                  or _dict(payload.get("output_format")))
    elif dialect is Dialect.OPENAI_RESPONSES:
        turns = _responses_turns(payload)
        reasoning = _effort(_dict(payload.get("reasoning")).get("effort"))
        cap = _positive_int(payload.get("max_output_tokens"))
        forced = _openai_forced(payload.get("tool_choice"))
        output = _dict(_dict(payload.get("text")).get("format"))
    else:
        turns = _chat_turns(payload)
        reasoning = _effort(payload.get("reasoning_effort")) or _effort(
            _dict(payload.get("reasoning")).get("effort"))
        cap = (_positive_int(payload.get("max_completion_tokens"))
               or _positive_int(payload.get("max_tokens")))
        forced = (_openai_forced(payload.get("tool_choice"))
                  or isinstance(payload.get("function_call"), dict))
        output = _dict(payload.get("response_format"))
    has_tools = _non_empty_list(payload.get("tools")) or _non_empty_list(payload.get("functions"))
    total, images, sample = _measure(turns, scan_limit)
    return RequestShape(
        stream=payload.get("stream") is True,
        has_tools=has_tools,
        tool_forced=has_tools and forced,
        has_images=images,
        reasoning=reasoning,
        max_tokens_cap=cap,
        prompt_chars=total,
        prompt_sample=sample,
        structured_output=_structured(output.get("type")),
    )


# --- helpers shared by the dialects ------------------------------------------------------

def _structured(kind: Any) -> str | None:
    """JSON mode or a JSON schema: the formats that constrain the output (`text` does not).
    Chat's `response_format`, Responses' `text.format`, Messages' `output_config.format`
    (and the older beta `output_format`) all name them alike."""
    return kind if kind in STRUCTURED_OUTPUT_KINDS else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _non_empty_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _effort(value: Any) -> Reasoning | None:
    if isinstance(value, str) and value and value != "none":
        return Reasoning(effort=value.lower())
    return None


def _openai_forced(choice: Any) -> bool:
    return choice == "required" or (isinstance(choice, dict) and bool(choice))


def _anthropic_thinking(value: Any) -> Reasoning | None:
    thinking = _dict(value)
    if thinking.get("type") in ("enabled", "adaptive"):
        return Reasoning(budget_tokens=_positive_int(thinking.get("budget_tokens")))
    return None


# A "turn" is a list of content items: strings (text) and part dicts. Turns are yielded in
# conversation order; `_measure` walks them newest first for the sample.

def _content_items(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return content
    return []


def _chat_turns(payload: dict[str, Any]) -> list[list[Any]]:
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return []
    return [_content_items(m.get("content")) for m in messages if isinstance(m, dict)]


def _anthropic_turns(payload: dict[str, Any]) -> list[list[Any]]:
    turns = [_content_items(payload.get("system"))]
    messages = payload.get("messages")
    if isinstance(messages, list):
        turns += [_content_items(m.get("content")) for m in messages if isinstance(m, dict)]
    return turns


def _responses_turns(payload: dict[str, Any]) -> list[list[Any]]:
    turns = [_content_items(payload.get("instructions"))]
    items = payload.get("input")
    if isinstance(items, str):
        return [*turns, [items]]
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                if "content" in item:
                    turns.append(_content_items(item.get("content")))
                elif isinstance(item.get("output"), str):
                    turns.append([item["output"]])
    return turns


def _texts(items: list[Any]) -> Iterator[str | None]:
    """Text of each item, or None for an image; nested tool results are opened."""
    for item in items:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            kind = item.get("type")
            if not isinstance(kind, str):
                continue
            if kind in _IMAGE_PARTS:
                yield None
            elif kind in _TEXT_PARTS and isinstance(item.get("text"), str):
                yield item["text"]
            elif kind == "tool_result":
                yield from _texts(_content_items(item.get("content")))


def _measure(turns: list[list[Any]], scan_limit: int) -> tuple[int, bool, str]:
    total = 0
    images = False
    pieces: list[str] = []
    budget = scan_limit
    for items in reversed(turns):
        for text in _texts(items):
            if text is None:
                images = True
                continue
            total += len(text)
            if budget > 0 and text:
                piece = text[:budget]
                pieces.append(piece)
                budget -= len(piece) + 1
    sample = "\n".join(pieces)
    if len(sample) * 4 > scan_limit:  # non-ASCII text: enforce the limit in UTF-8 bytes
        sample = sample.encode("utf-8", "surrogatepass")[:scan_limit].decode("utf-8", "ignore")
    return total, images, sample
