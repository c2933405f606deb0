"""The SPEC's rollout list as requests and what the gateway should do with each (issue 42).

The SPEC asks an operator to test, on a test group, "simple text, code/debug prompts,
multi-turn affinity, TTL expiry, caller isolation, tool requests, forced tool requests,
image requests where supported, structured-output requests where supported, reasoning or
thinking requests where supported, streaming cancellation, and low explicit max-token
caps". Each becomes an `Item`: the turns to send (OpenAI Chat bodies, as a caller sends
them) and, per turn, what should happen. What should happen is not written here a second
time: each body is decided offline by the same code `sidecar explain` runs
(`commands.explain.decide`), so the targets allowed to serve it, its complexity and the
refusal a group that cannot serve it gives come from the configuration through the router
itself. Pure: no I/O; `check_run.py` sends the turns and reads back the gateway's rows.

Every run gets a fresh `nonce` in each conversation's opening, so a pin an earlier run left
cannot make a first turn a `hit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.commands.explain import decide
from sidecar.config.models import SidecarConfig
from sidecar.config.policy import Affinity
from sidecar.dialects.apis import Dialect
from sidecar.routing.decision import Decision

DEBUG_PROMPT = """My service crashes after this change. Please find the bug.

Traceback (most recent call last):
  File "service/orders.py", line 42, in handle
    order = orders[order_id]
KeyError: 'A-1001'

diff --git a/service/orders.py b/service/orders.py
@@ -40,3 +40,3 @@
-    order = orders.get(order_id)
+    order = orders[order_id]
"""
TOOL = {"type": "function", "function": {
    "name": "lookup_order", "description": "Look an order up by its id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}
# A 1×1 transparent PNG: an image part every vision API accepts.
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNk"
         "YAAAAAYAAjCB0C8AAAAASUVORK5CYII=")
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "string"}},
    "required": ["answer"], "additionalProperties": False}}}
LOW_CAP = 16


@dataclass(frozen=True, slots=True)
class Expect:
    """What one turn should get. `allowed`: the targets that may serve it (empty: the group
    should refuse it, with `refusal` in the message)."""

    allowed: frozenset[str]
    refusal: str = ""
    complexity: str | None = None
    affinity: str | None = None          # the decision's affinity outcome, when it matters
    same_target_as: int | None = None    # this turn selects what that turn selected
    error_class: str | None = None       # what the gateway must record (client_cancel)
    max_output_tokens: int | None = None  # the reply's length as the provider counted it

    @property
    def refused(self) -> bool:
        return not self.allowed


@dataclass(frozen=True, slots=True)
class Turn:
    body: dict[str, Any]
    expect: Expect
    second_caller: bool = False   # sent with the second caller token
    cancel: bool = False          # a stream the check closes after its first event
    wait_s: float = 0.0           # sent this long after the turn before it


@dataclass(frozen=True, slots=True)
class Item:
    name: str
    spec_words: str
    turns: tuple[Turn, ...] = ()
    skipped: str = ""   # why it is not run; said in the report, never silently left out


def _expect(config: SidecarConfig, body: dict[str, Any], caller: str | None = None,
            **extra: Any) -> Expect:
    outcome = decide(config, body, Dialect.OPENAI_CHAT, caller=caller)
    if not isinstance(outcome, Decision):
        return Expect(frozenset(), refusal=outcome.reason, **extra)
    return Expect(frozenset(c.label for c in outcome.ordered),
                  complexity=outcome.trace.complexity, **extra)


def _first_turn_affinity(config: SidecarConfig, body: dict[str, Any]) -> str:
    return decide(config, body, Dialect.OPENAI_CHAT).trace.affinity


def _follow_up(body: dict[str, Any], reply: str, question: str) -> dict[str, Any]:
    return {**body, "messages": [*body["messages"], {"role": "assistant", "content": reply},
                                 {"role": "user", "content": question}]}


def checklist(config: SidecarConfig, group: str, nonce: str, *, second_caller: bool,
              wait_ttl: bool, caller: str | None = None) -> list[Item]:
    """The SPEC's list for `group`, in the SPEC's order. `caller`: the configured caller
    the first token belongs to, when known (its spend ceiling is part of its decisions)."""
    def body(text: str, **fields: Any) -> dict[str, Any]:
        return {"model": group, "messages": [{"role": "user", "content": f"{text} ({nonce})"}],
                **fields}

    def single(name: str, words: str, request: dict[str, Any], **extra: Any) -> Item:
        return Item(name, words, (Turn(request, _expect(config, request, caller,
                                                        **extra)),))

    affinity = config.models[group].dynamic_score.affinity
    return [
        single("simple_text", "simple text", body("Say hello in one short sentence.")),
        single("code_debug", "code/debug prompts", body(DEBUG_PROMPT)),
        _multi_turn(config, body("Let us plan a trip to Lisbon, step by step."), caller),
        _ttl_expiry(config, body("Help me name a cat."), affinity, wait_ttl, caller),
        _caller_isolation(config, body("Help me write a haiku about rain."), second_caller,
                          caller),
        single("tools", "tool requests",
               body("What is the status of order A-1001?", tools=[TOOL])),
        single("forced_tool", "forced tool requests",
               body("Look up order A-1002.", tools=[TOOL], tool_choice="required")),
        single("images", "image requests where supported",
               {"model": group, "messages": [{"role": "user", "content": [
                   {"type": "text", "text": f"What is in this picture? ({nonce})"},
                   {"type": "image_url", "image_url": {"url": PIXEL}}]}]}),
        single("structured_output", "structured-output requests where supported",
               body("Answer in JSON: what is the capital of France?",
                    response_format=SCHEMA)),
        single("reasoning", "reasoning or thinking requests where supported",
               body("Which is larger, 9.11 or 9.9? Think it through.",
                    reasoning_effort="low")),
        _cancellation(config, body("Write a long story about a lighthouse keeper.",
                                   stream=True), caller),
        single("low_max_tokens", "low explicit max-token caps",
               body("Count from one to one hundred in words.",
                    max_completion_tokens=LOW_CAP), max_output_tokens=LOW_CAP),
    ]


def _multi_turn(config: SidecarConfig, opening: dict[str, Any], caller: str | None
                ) -> Item:
    first = _first_turn_affinity(config, opening)
    second = _follow_up(opening, "Day one: the old town.", "And on day two?")
    pinned = first == "miss_created"
    return Item("multi_turn_affinity", "multi-turn affinity", (
        Turn(opening, _expect(config, opening, caller, affinity=first)),
        Turn(second, _expect(config, second, caller, affinity="hit" if pinned else first,
                             same_target_as=0 if pinned else None))))


def _ttl_expiry(config: SidecarConfig, opening: dict[str, Any], affinity: Affinity,
                wait_ttl: bool, caller: str | None) -> Item:
    """Turn 1 pins; turn 2, half a TTL later, hits; turn 3, half a TTL and a second after
    that, finds the pin expired: the TTL runs from the pin's creation and the hit did not
    extend it (the SPEC: "TTL is not extended by hits")."""
    words = "TTL expiry"
    ttl = affinity.ttl_seconds
    if _first_turn_affinity(config, opening) != "miss_created":
        return Item("ttl_expiry", words, skipped="this group pins no conversation "
                    "(affinity is off, or not a dynamic_score group): no TTL to expire")
    if not wait_ttl:
        return Item("ttl_expiry", words, skipped=f"needs {ttl + 1} s of waiting for the pin "
                    "to expire: run with --wait-ttl")
    hit = _follow_up(opening, "How about Miso?", "Another idea, please.")
    later = _follow_up(hit, "Or Pixel.", "One more, please.")
    return Item("ttl_expiry", words, (
        Turn(opening, _expect(config, opening, caller, affinity="miss_created")),
        Turn(hit, _expect(config, hit, caller, affinity="hit", same_target_as=0),
             wait_s=ttl / 2),
        Turn(later, _expect(config, later, caller, affinity="expired_replaced"),
             wait_s=ttl / 2 + 1.0)))


def _caller_isolation(config: SidecarConfig, opening: dict[str, Any],
                      second_caller: bool, caller: str | None) -> Item:
    words = "caller isolation"
    first = _first_turn_affinity(config, opening)
    if first != "miss_created":
        return Item("caller_isolation", words, skipped="this group pins no conversation "
                    "(affinity is off, or not a dynamic_score group): nothing to isolate")
    if not second_caller:
        return Item("caller_isolation", words, skipped="needs a second caller's token "
                    "(--second-token-file or --second-token-env) with access to the group")
    # The second caller opens the very same conversation: it must not find the first
    # caller's pin (a `hit` would mean pins are shared across callers).
    return Item("caller_isolation", words, (
        Turn(opening, _expect(config, opening, caller, affinity="miss_created")),
        Turn(opening, _expect(config, opening, caller, affinity="miss_created"),
             second_caller=True)))


def _cancellation(config: SidecarConfig, request: dict[str, Any], caller: str | None
                  ) -> Item:
    # The check closes the stream after its first event; the gateway must record that the
    # caller went away (a stream that ends before then cannot be cancelled, and fails).
    return Item("streaming_cancellation", "streaming cancellation", (
        Turn(request, _expect(config, request, caller, error_class="client_cancel"),
             cancel=True),))
