"""Dialect bridges: a request in one API dialect served by a target of another
(docs/dialects.md). Pure translators on parsed JSON, one per ordered dialect pair
(registry.py); what a target cannot express raises `Untranslatable`, never a silent loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Untranslatable(ValueError):
    """A field of the request (or answer) has no faithful equivalent in the other dialect.

    `field` is its path in the caller's body (`messages[2].content[0].type`), `reason` what
    the target lacks; both are safe to show the caller (no values, only names)."""

    def __init__(self, field: str, reason: str) -> None:
        field = field[:120] or "''"  # unknown keys are the caller's own text: kept short
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnreadableAnswer(ValueError):
    """The upstream answer is not what its dialect promises: the caller gets a 502."""


def present(body: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The fields of `body` among `keys` that are set (not null): those both dialects
    spell the same and carry over as they are."""
    return {key: body[key] for key in keys if body.get(key) is not None}


def translated_parts(content: object, where: str, target: str,
                     text: Callable[[dict[str, Any]], dict[str, Any]],
                     image: Callable[[dict[str, Any], str], dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """An OpenAI Chat content list (or string) part by part: `text(part)` for text,
    `image(part, path)` for `image_url`; any other part cannot cross to `target`."""
    if isinstance(content, str):
        return [text({"type": "text", "text": content})]
    if not isinstance(content, list):
        raise Untranslatable(where, "a string or a list of parts is required")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(text(part))
        elif kind == "image_url":
            parts.append(image(part, f"{where}[{j}].image_url"))
        else:
            raise Untranslatable(f"{where}[{j}].type",
                                 f"{str(kind)[:20]!r} parts are not bridged to {target}")
    return parts


def translated_tools(tools: object,
                     convert: Callable[[object, str], dict[str, Any]]) -> list[dict] | None:
    """Each tool of a request converted (`convert(tool, path)`), or None when there are none."""
    if not tools:
        return None
    if not isinstance(tools, list):
        raise Untranslatable("tools", "a list is required")
    return [convert(tool, f"tools[{i}]") for i, tool in enumerate(tools)]


def joined_text(content: object, where: str, separator: str, reason: str) -> str:
    """A string, or a list of text parts/blocks joined (both dialects use
    `{"type": "text", "text": ...}`); anything else in the list is untranslatable."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise Untranslatable(f"{where}[{j}]", reason)
            texts.append(str(part.get("text", "")))
        return separator.join(texts)
    raise Untranslatable(where, "a string or a list of text parts is required")


def chat_answer(answer: Any) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """An OpenAI Chat answer read for translation: its first choice, that choice's message,
    and the message's function calls (each with a `function` object); raises
    `UnreadableAnswer` when the answer is not shaped so."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UnreadableAnswer("the OpenAI answer has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise UnreadableAnswer("the OpenAI answer's first choice has no message")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise UnreadableAnswer("tool calls that are not a list")
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise UnreadableAnswer("a tool call without a function")
    return choice, message, calls
