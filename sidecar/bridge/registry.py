"""Which dialect pairs can be bridged, and the translator for each (docs/dialects.md §1).

A translator is three pure steps: the caller's request body into the target's, the
target's unary answer into the caller's, and the target's error into the caller's. Adding a
dialect means adding its translators here; nothing else learns the pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.bridge import (
    chat_to_messages,
    chat_to_responses,
    messages_to_chat,
    responses_to_chat,
)
from sidecar.bridge.errors import translated_error
from sidecar.dialects.apis import Dialect

Body = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Translator:
    caller: Dialect
    target: Dialect
    _request: Callable[[Body], dict[str, Any]]
    _response: Callable[[Body, str, Callable[[], float]], dict[str, Any]]

    def request(self, body: Body) -> dict[str, Any]:
        """Raises `Untranslatable` naming the field the target cannot express."""
        return self._request(body)

    def response(self, answer: Body, model: str,
                 clock: Callable[[], float] = time.time) -> dict[str, Any]:
        """Raises `UnreadableAnswer` when the target's answer is not in its dialect."""
        return self._response(answer, model, clock)

    def error(self, status: int, body: bytes) -> tuple[int, bytes]:
        if self.caller is self.target:  # same API: the provider's error as it is
            return status, body
        return translated_error(status, body, self.caller)


_TRANSLATORS = {
    (Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES): Translator(
        Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES, chat_to_messages.request,
        chat_to_messages.response),
    (Dialect.ANTHROPIC_MESSAGES, Dialect.OPENAI_CHAT): Translator(
        Dialect.ANTHROPIC_MESSAGES, Dialect.OPENAI_CHAT, messages_to_chat.request,
        lambda answer, model, _clock: messages_to_chat.response(answer, model)),
    (Dialect.OPENAI_RESPONSES, Dialect.OPENAI_CHAT): Translator(
        Dialect.OPENAI_RESPONSES, Dialect.OPENAI_CHAT, responses_to_chat.request,
        responses_to_chat.response),
    # Responses to Messages goes through Chat: one translator per step, composed.
    (Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC_MESSAGES): Translator(
        Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC_MESSAGES,
        lambda body: chat_to_messages.request(responses_to_chat.request(body)),
        lambda answer, model, clock: responses_to_chat.response(
            chat_to_messages.response(answer, model, clock), model, clock)),
}


# Responses requests go upstream unary even to Responses targets, and the caller's stream
# is synthesized (SPEC, Streaming): the same machinery with nothing to translate.
UNARY_NATIVE = {
    Dialect.OPENAI_RESPONSES: Translator(
        Dialect.OPENAI_RESPONSES, Dialect.OPENAI_RESPONSES,
        lambda body: {**body, "stream": False},
        lambda answer, model, _clock: dict(answer)),
}


# Chat callers in a stateful session on a Responses target (docs/dialects.md §13): the
# session's previous response id is threaded in by gateway/bridging.py.
SESSION_TRANSLATOR = Translator(
    Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES,
    lambda body: chat_to_responses.request(body, None), chat_to_responses.response)


@dataclass(frozen=True, slots=True)
class ProcessedRoute:
    """A way to a target through the sidecar's response processing: which caller API takes
    it, the API spoken upstream, the translator, and its cluster-name suffix."""

    caller: Dialect
    speaks: Dialect
    translator: Translator
    suffix: str
    kind: str  # "unary" (Responses to a Responses target), "bridge", "session" or "cache"


SESSION_SUFFIX = "openai_chat_session"
CACHE_SUFFIX = "_cached"

# A response-cache miss in a caller's own API (docs/cache.md): nothing to translate; the
# processing only sees the answer to store it.
CACHE_PASSTHROUGH = {
    dialect: Translator(dialect, dialect, dict, lambda answer, model, _clock: dict(answer))
    for dialect in (Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES)
}


def processed_routes(native: tuple[Dialect, ...] | list[Dialect], bridges: bool,
                     cached: bool = False) -> list[ProcessedRoute]:
    """Each processed route to a target speaking `native`: Responses callers of a Responses
    target always (and Chat callers' stateful sessions there), when the group bridges every
    bridged caller API, and when it caches answers the cache route of each native API."""
    routes = [ProcessedRoute(dialect, dialect, translator, dialect.value, "unary")
              for dialect, translator in UNARY_NATIVE.items() if dialect in native]
    if Dialect.OPENAI_RESPONSES in native:
        routes.append(ProcessedRoute(Dialect.OPENAI_CHAT, Dialect.OPENAI_RESPONSES,
                                     SESSION_TRANSLATOR, SESSION_SUFFIX, "session"))
    if bridges:
        for caller in bridged_callers(native):
            target = bridge_target(caller, native)
            if target is not None:
                routes.append(ProcessedRoute(caller, target, _TRANSLATORS[(caller, target)],
                                             caller.value, "bridge"))
    if cached:
        routes.extend(ProcessedRoute(dialect, dialect, translator,
                                     dialect.value + CACHE_SUFFIX, "cache")
                      for dialect, translator in CACHE_PASSTHROUGH.items() if dialect in native)
    return routes


def translator_for(caller: Dialect, target: Dialect) -> Translator | None:
    """The bridge from `caller` to `target`; None when the pair is not bridged (or needs
    no bridge: the same dialect)."""
    return _TRANSLATORS.get((caller, target))


def bridged_pairs() -> frozenset[tuple[Dialect, Dialect]]:
    return frozenset(_TRANSLATORS)


def bridged_callers(native: tuple[Dialect, ...] | list[Dialect]) -> tuple[Dialect, ...]:
    """Caller dialects that reach a target speaking `native` only through a bridge."""
    return tuple(caller for caller in Dialect if caller not in native
                 and any((caller, target) in _TRANSLATORS for target in native))


def bridge_target(caller: Dialect, native: tuple[Dialect, ...] | list[Dialect]) -> Dialect | None:
    """The dialect a bridge from `caller` speaks to a target of `native` (its first bridged
    one); None when `caller` is native there or no bridge reaches it."""
    if caller in native:
        return None
    return next((target for target in native if (caller, target) in _TRANSLATORS), None)
