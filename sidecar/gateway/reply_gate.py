"""What the reply gate decides about a held reply (docs/reply-gate.md), without Envoy types.

Two kinds of reply reach it, told apart by their content type (the gate's matchers in
envoy_config/reply_gate.py send nothing else):

- a reply of undeclared length that is not an event stream: read once whole (or as much as
  Envoy's buffer holds) for its usage, then released;
- an event stream of a group that commits at the first event: held until its first
  complete event. A data event (or the end of the stream) releases it; an in-band error
  (Anthropic's `event: error`, an OpenAI chunk with an `error` object) makes the router
  retry it, under the status the same error would have had as an HTTP reply.

Comments (`: keep-alive`) and Anthropic `ping` events carry no answer, so they do not
release a stream. What is held is bounded: past `MAX_HELD_EVENT_BYTES` without a complete
event the stream is released as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.envoy_contract import (
    ATTEMPT_MARK_HEADER,
    CONTEXT_RETRY_HEADER,
    SAME_TARGET_WAIT_HEADER,
    UNRECOGNISED_HEADER,
)
from sidecar.gateway.attempt_orders import (
    AttemptOrder,
    earns_same_target,
    order_after_failure,
    order_after_refusal,
    retry_after_seconds,
)
from sidecar.observe.rate_limits import RETRY_AFTER, requested_wait_s
from sidecar.observe.refusals import is_context_refusal, unrecognised_mark
from sidecar.observe.reply_reading import Facts, json_reply_facts

MAX_HELD_EVENT_BYTES = 64 * 1024
# The status a stream still without its first event at its deadline is retried under.
FIRST_EVENT_OVERDUE_STATUS = 504
# Envoy sent no attempt order (the gate was not given one): nothing is rewritten.
NO_ORDER = AttemptOrder()

# An in-band error's type → the status its HTTP form has (docs.anthropic.com/en/api/errors,
# platform.openai.com/docs/guides/error-codes), so that the router retries it as it would
# the HTTP error, and a last attempt's error is reported as such (429 stays 429, the rest
# become the gateway's 502). Request errors are the caller's: released, not retried.
_STATUS_OF_ERROR = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500,
                    "rate_limit_exceeded": 429, "requests": 429, "tokens": 429,
                    "insufficient_quota": 429, "server_error": 500}
_REQUEST_ERRORS = frozenset({"invalid_request_error", "authentication_error",
                             "permission_error", "not_found_error", "request_too_large",
                             "invalid_request", "context_length_exceeded"})
_DEFAULT_ERROR_STATUS = 502


@dataclass(frozen=True, slots=True)
class Release:
    """Let the reply go on; `facts` go to its usage metadata, `set_headers` onto it."""

    facts: Facts = field(default_factory=dict)
    set_headers: tuple[tuple[str, str], ...] = ()
    # The attempt order rewritten for the next attempts (attempt_orders.py).
    attempt_order: AttemptOrder | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """Make the router retry the attempt: the held reply's status becomes `status`."""

    status: int
    error_type: str
    # The attempt order with the same target next (attempt_orders.py), where it changed.
    attempt_order: AttemptOrder | None = None


Verdict = Release | Retry | None  # None: hold, and wait for more


def is_event_stream(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").lower().startswith("text/event-stream")


class UndeclaredLengthGate:
    """A JSON (or any non-stream) reply without a declared length. Like the Lua hold of
    replies of declared length (envoy_config/upstream_errors.py), it marks a context-length
    refusal of the catalogue retriable, names a refusal no entry knows (the access log
    counts it), and gives a 429 that names its wait only in reset headers a
    `retry-after`."""

    __slots__ = ("_headers", "_order", "_status")

    def __init__(self, headers: Mapping[str, str],
                 order: AttemptOrder = NO_ORDER) -> None:
        """`order`: the request's attempt order, when Envoy sent it."""
        self._headers = headers
        self._order = order
        status = headers.get(":status", "")
        self._status = int(status) if status.isdigit() else 0

    def body(self, body: bytes, end_of_stream: bool, now: float) -> Release:
        """Envoy sends the body once: whole (`end_of_stream`), or the part its buffer held,
        after which the rest passes unread (no facts: the usage comes last). `now`: wall
        clock, for reset headers that name a moment."""
        facts = json_reply_facts(body) if end_of_stream else {}
        if end_of_stream and is_context_refusal(self._status, body):
            return self._refused(facts)
        mark = unrecognised_mark(self._status, body) if end_of_stream else None
        if mark is not None:
            return Release(facts, ((UNRECOGNISED_HEADER, mark),))
        retry_after = self._headers.get(RETRY_AFTER)
        added: tuple[tuple[str, str], ...] = ()
        if self._status == 429 and retry_after is None:
            wait = requested_wait_s(self._headers, now)
            if wait is not None:
                retry_after = str(math.ceil(wait))
                added = ((RETRY_AFTER, retry_after),)
        again = _same_target_next(self._order, self._headers, self._status, retry_after)
        if again is not None:
            added += _wait_before(again, retry_after)
        return Release(facts, added, again)

    def _refused(self, facts: Facts) -> Release:
        """A context refusal: retried on the next other target, never on this one."""
        if not self._order.clusters:
            return Release(facts, ((CONTEXT_RETRY_HEADER, "context_window"),))
        order = order_after_refusal(self._order.clusters, _attempt(self._headers))
        if order is None:
            return Release(facts)
        return Release(facts, ((CONTEXT_RETRY_HEADER, "context_window"),),
                       AttemptOrder(order, self._order.same_target_retries,
                                    self._order.same_target_wait_s))


def _attempt(headers: Mapping[str, str]) -> int:
    value = headers.get(ATTEMPT_MARK_HEADER, "")
    return int(value) if value.isdigit() else 0


def _same_target_next(order: AttemptOrder, headers: Mapping[str, str], status: int,
                      retry_after: str | None = None) -> AttemptOrder | None:
    """For a held 5xx, or a 429 whose `retry-after` the group waits out, in a group with
    `retry_same_target`: the order with the same target next (attempt_orders.py); None
    when nothing changes. `retry_after`: the reply's, or the one the gate adds."""
    if not order.same_target_retries or not earns_same_target(
            status, retry_after_seconds(retry_after), order.same_target_wait_s):
        return None
    after = order_after_failure(order.clusters, _attempt(headers), order.same_target_retries)
    if after == order.clusters:
        return None
    return AttemptOrder(after, order.same_target_retries, order.same_target_wait_s)


def _wait_before(order: AttemptOrder, retry_after: str | None) -> tuple[tuple[str, str], ...]:
    """The same target is next: the wait Envoy's rate-limited back-off spends first, where
    the reply named one within the group's (SAME_TARGET_WAIT_HEADER; never before another
    target)."""
    seconds = retry_after_seconds(retry_after)
    if seconds is None or seconds > order.same_target_wait_s:
        return ()
    return ((SAME_TARGET_WAIT_HEADER, str(int(seconds))),)


class FirstEventGate:
    """An event stream, held until its first event that carries something."""

    __slots__ = ("_headers", "_held", "_order")

    def __init__(self, headers: Mapping[str, str] | None = None,
                 order: AttemptOrder = NO_ORDER) -> None:
        self._held = bytearray()
        self._headers = headers or {}
        self._order = order

    @property
    def deadline_s(self) -> float:
        """Seconds this attempt may wait for its first event before it is retried on the
        next target (0: the group's first-token wait, which the router bounds): the
        primary's own deadline, set at the decision, for the first attempt only."""
        return self._order.first_event_deadline_s if _attempt(self._headers) == 1 else 0.0

    def overdue(self) -> Retry:
        """No first event by the deadline: retried as a gateway timeout, on the next
        target of the order (a timeout never earns the same target again)."""
        return Retry(FIRST_EVENT_OVERDUE_STATUS, "first_event_timeout")

    def body(self, chunk: bytes, end_of_stream: bool) -> Verdict:
        self._held += chunk
        verdict = first_event_verdict(bytes(self._held))
        if isinstance(verdict, Retry):
            # An in-band 5xx or 429 may not repeat: the same target first, if the group
            # says so.
            again = _same_target_next(self._order, self._headers, verdict.status,
                                      self._headers.get(RETRY_AFTER))
            return Retry(verdict.status, verdict.error_type, again)
        if verdict is not None:
            return verdict
        if end_of_stream or len(self._held) >= MAX_HELD_EVENT_BYTES:
            return Release()
        return None


def first_event_verdict(held: bytes) -> Verdict:
    """The verdict on the held start of a stream, or None while no event that counts is
    complete."""
    text = held.replace(b"\r\n", b"\n")
    while b"\n\n" in text:
        event, text = text.split(b"\n\n", 1)
        name, data = _fields(event)
        if name == "ping" or not data:
            continue  # a comment, a keep-alive or a ping: nothing to commit to yet
        return _error_verdict(name, data) or Release()
    return None


def _fields(event: bytes) -> tuple[str, str]:
    name, data = "", []
    for line in event.decode("utf-8", "replace").split("\n"):
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return name, "\n".join(data)


def _error_verdict(name: str, data: str) -> Retry | None:
    if name != "error" and '"error"' not in data:
        return None
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if name != "error" and not isinstance(error, dict):
        return None  # an ordinary event that mentions "error" in its text
    kind = ""
    if isinstance(error, dict):
        for key in ("type", "code"):
            if isinstance(error.get(key), str):
                kind = error[key]
                break
    if kind in _REQUEST_ERRORS:
        return None
    return Retry(_STATUS_OF_ERROR.get(kind, _DEFAULT_ERROR_STATUS), kind or "unknown")
