"""Bridged attempts (docs/dialects.md §7): the upstream ext_proc on a bridge cluster hands
the sidecar each attempt's request, then the response; the sidecar translates both.

Only bridge clusters ask for the response, so native traffic never passes through here.
Per attempt: the request body (the caller's API, as the router holds it) gets this target's
model and is translated, the path set to the target's endpoint; the response headers keep
their status and get the caller's content type; the response body is translated back, or,
for a caller that asked to stream, synthesized into its event stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.bridge import UnreadableAnswer, Untranslatable, chat_to_responses
from sidecar.bridge.registry import Translator
from sidecar.bridge.streams import chat_sse, messages_sse, responses_sse
from sidecar.dialects.apis import DEFAULT_ANTHROPIC_VERSION, Dialect
from sidecar.dialects.errors import ClientError
from sidecar.envoy_contract import CACHE_HEADER
from sidecar.gateway.runtime import BridgeRoute
from sidecar.gateway.sessions import SessionStore

JSON = "application/json"
EVENT_STREAM = "text/event-stream"


def bridge_refusal(translators: tuple[Translator, ...] | None,
                   payload: Mapping[str, Any]) -> str | None:
    """Why the request cannot cross its group's bridges (`field: reason`), or None."""
    for translator in translators or ():
        try:
            translator.request(payload)
        except Untranslatable as refused:
            return str(refused)
    return None


@dataclass(slots=True)
class BridgeAttempt:
    """One attempt through a bridge cluster, from its request to its response."""

    bridge: BridgeRoute
    stream: bool = False
    include_usage: bool = False
    status: int = 0
    session_key: str | None = None  # a stateful session's turn (sessions.py)
    # A response-cache miss: the slot its answer is stored under (cache/slots.py).
    cache_slot: str | None = None
    storable: bool = False  # 2xx, unencoded: what the cache may keep
    content_type: str = JSON


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Header changes and a new body, for a request or a response."""

    set_headers: tuple[tuple[str, str], ...]
    remove_headers: tuple[str, ...]
    body: bytes | None = None


def request_rewrite(attempt: BridgeAttempt, body: bytes,
                    sessions: SessionStore | None = None) -> Rewrite | ClientError:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return ClientError(400, "the request body is not JSON (or is nested too deeply)")
    if not isinstance(payload, dict):
        return ClientError(400, "the request body is not a JSON object")
    route = attempt.bridge.route
    attempt.stream = payload.get("stream") is True
    options = payload.get("stream_options")
    attempt.include_usage = isinstance(options, dict) and options.get("include_usage") is True
    try:
        if attempt.bridge.session:
            translated = _session_request(attempt, {**payload, "model": route.model_ref},
                                          sessions)
        else:
            translated = attempt.bridge.translator.request({**payload,
                                                            "model": route.model_ref})
    except Untranslatable as refused:  # routing checked it; a retry's body is the same
        return ClientError(400, f"This request cannot be bridged to another API: {refused}")
    new_body = compact_json(translated)
    headers = [(":path", route.path), ("content-length", str(len(new_body))),
               ("content-type", JSON)]
    translator = attempt.bridge.translator
    if translator.caller is translator.target:  # nothing crossed: the caller's headers hold
        return Rewrite(tuple(headers), (), new_body)
    if translator.target.is_anthropic:
        headers.append(("anthropic-version", DEFAULT_ANTHROPIC_VERSION))
    return Rewrite(tuple(headers), ("anthropic-beta",), new_body)


def _session_request(attempt: BridgeAttempt, payload: dict[str, Any],
                     sessions: SessionStore | None) -> dict[str, Any]:
    session = (sessions.get(attempt.session_key)
               if sessions is not None and attempt.session_key else None)
    return chat_to_responses.request(payload, session.response_id if session else None)


def response_headers(attempt: BridgeAttempt, headers: Mapping[str, str]) -> Rewrite:
    """The status stays (the router's retry decision reads it); the body will change."""
    try:
        attempt.status = int(headers.get(":status", "0"))
    except ValueError:
        attempt.status = 0
    attempt.storable = (attempt.cache_slot is not None and 200 <= attempt.status < 300
                        and headers.get("content-encoding", "identity") == "identity")
    marks = ((CACHE_HEADER, "miss"),) if attempt.cache_slot is not None else ()
    if attempt.bridge.passthrough:
        attempt.content_type = headers.get("content-type", JSON)
        return Rewrite(marks, ())
    streaming = attempt.stream and 200 <= attempt.status < 300
    return Rewrite((("content-type", EVENT_STREAM if streaming else JSON), *marks),
                   ("content-length", "content-encoding"))


def response_body(attempt: BridgeAttempt, body: bytes, clock: Callable[[], float],
                  sessions: SessionStore | None = None,
                  store: Callable[[str, bytes, str], object] | None = None) -> Rewrite:
    """`store(slot, answer)`: keep a cache miss's answer as the caller receives it."""
    if attempt.bridge.passthrough:
        if attempt.storable and store is not None and attempt.cache_slot and body:
            store(attempt.cache_slot, body, attempt.content_type)
        # The whole body is here (a reply of undeclared length too): its length lets
        # Envoy's usage reader read it (observation_filters.py), as for any other reply.
        return Rewrite((("content-length", str(len(body))),), (), None)
    translator = attempt.bridge.translator
    if attempt.session_key and sessions is not None and 200 <= attempt.status < 300:
        answered = chat_to_responses.response_id(body)
        if answered is not None:
            sessions.answered(attempt.session_key, answered)
    if not 200 <= attempt.status < 300:
        _status, error = translator.error(attempt.status, body)
        return Rewrite((), (), error)
    try:
        answer = json.loads(body)
        if not isinstance(answer, dict):
            raise UnreadableAnswer("not a JSON object")
        model = str(answer.get("model") or attempt.bridge.route.model_ref)
        translated = translator.response(answer, model, clock)
        if attempt.stream:
            return Rewrite((), (), _synthesized(translator.caller, translated,
                                                attempt.include_usage))
    except _UNREADABLE:
        # Not JSON, nested past the parser's depth, or not the shape its dialect promises
        # (a passed-through answer is not checked before its stream is synthesized): the
        # caller gets a 502 in its own dialect, never a traceback.
        error = ClientError(502, "The provider's answer could not be translated to this API.")
        rendered = error.render(translator.caller.is_anthropic)
        return Rewrite(((":status", "502"), ("content-type", JSON),
                        ("content-length", str(len(rendered)))), (), rendered)
    answer_body = compact_json(translated)
    if attempt.storable and store is not None and attempt.cache_slot:
        store(attempt.cache_slot, answer_body, JSON)
    # A length, as the provider's own JSON had: Envoy's usage extraction reads only
    # replies of declared length (observation_filters.py).
    return Rewrite((("content-length", str(len(answer_body))),), (), answer_body)


# What a provider's answer can make a translator or a stream synthesis raise.
_UNREADABLE = (ValueError, RecursionError, UnreadableAnswer, KeyError, TypeError,
               AttributeError, IndexError)


def compact_json(value: object) -> bytes:
    """JSON as the caller would write it: non-ASCII characters as UTF-8, not as `\\uXXXX`
    escapes (which make a body of emoji three times larger than the one the caller sent,
    and the limit then refuses a bridged or cached request it lets through natively). A
    string with a lone surrogate (valid JSON, not UTF-8) is escaped as before."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _synthesized(caller: Dialect, translated: dict[str, Any], include_usage: bool) -> bytes:
    if caller.is_anthropic:
        return messages_sse(translated)
    if caller is Dialect.OPENAI_RESPONSES:
        return responses_sse(translated)
    return chat_sse(translated, include_usage)
