"""A tool call cut by the output limit: what of its arguments can be carried.

An OpenAI Chat target cut by `max_tokens` (or its own limit) answers `finish_reason:
"length"` and hands the tool call's `arguments` string as far as it was generated: often
not JSON (`{"city": "Os`). Anthropic's own API, cut there, answers `stop_reason:
"max_tokens"` with the `tool_use` block still in `content`, its `input` holding what was
complete (platform.claude.com/docs/en/build-with-claude/handling-stop-reasons: "max_tokens
... Raise max_tokens or continue the response"; an incomplete tool_use block is retried by
the caller with a higher limit). The bridge does the same (docs/dialects.md §4): the
arguments parsed when they are a JSON object; otherwise the object's top-level members
that were complete before the cut, read with Python's own JSON decoder member by member
(never by byte patterns), and `{}` when none was.
"""

from __future__ import annotations

import json
from typing import Any

_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def complete_members(arguments: str) -> dict[str, Any]:
    """The members of a JSON object text that were whole before it was cut (in order, a
    later duplicate key winning as in `json.loads`); `{}` when it is no object's start."""
    members: dict[str, Any] = {}
    at = _skip(arguments, 0)
    if not arguments.startswith("{", at):
        return members
    at += 1
    try:
        while True:
            at = _skip(arguments, at)
            if not arguments.startswith('"', at):
                return members
            key, at = _DECODER.raw_decode(arguments, at)
            at = _skip(arguments, at)
            if not arguments.startswith(":", at):
                return members
            value, at = _DECODER.raw_decode(arguments, _skip(arguments, at + 1))
            at = _skip(arguments, at)
            # Whole when a `,` or `}` follows, or when the text ends after a value that
            # cannot be cut unseen (a number can: `12` of `123`; `-1` of `-1.5`).
            ended = at >= len(arguments) and not (
                isinstance(value, int | float) and not isinstance(value, bool))
            if not (ended or arguments.startswith((",", "}"), at)):
                return members
            members[key] = value
            if not arguments.startswith(",", at):
                return members
            at += 1
    except (ValueError, RecursionError):
        return members


def cut_tool_input(arguments: object) -> dict[str, Any]:
    """A truncated answer's tool-call arguments as a `tool_use` input (see the module)."""
    text = arguments if isinstance(arguments, str) else ""
    try:
        parsed = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return complete_members(text)
    return parsed if isinstance(parsed, dict) else {}
