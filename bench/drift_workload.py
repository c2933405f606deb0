"""The routing-quality benchmark's seeded workload and provider profiles.

Three interchangeable targets as issue #14 describes them (premium: fast, validated, dear;
mid: validated; budget: cheap, not validated), each a fake provider whose latency, output
rate and error rate the benchmark changes between phases, and a mixed workload drawn from
one seed so every strategy sees exactly the same requests at the same offsets:

- simple questions (one sentence asked, a short answer),
- debugging requests (code with a stack trace or a diff, some long code) with long answers,
- multi-turn conversations that resend their history, one turn after the previous reply.

A share of each kind is streamed. Prompts are distinct, so only a conversation's own
turns share an affinity key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from sidecar.devstack.providers import Behaviour

SIMPLE, DEBUG, CHAT = "simple", "debug", "chat"


@dataclass(frozen=True)
class Profile:
    """A provider's healthy behaviour and what the router is told about it."""

    name: str
    model: str
    weight: int
    input_per_mtok: float
    output_per_mtok: float
    tags: tuple[str, ...]
    quality: float
    ttfb_s: float
    tokens_per_s: float
    error_rate: float

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok
                + completion_tokens * self.output_per_mtok) / 1e6


PROFILES = (
    Profile("premium", "premium-large", 50, 2.50, 10.00, ("validated",), 0.92,
            0.35, 150.0, 0.002),
    Profile("mid", "mid-medium", 30, 0.40, 1.60, ("validated", "low_cost"), 0.85,
            0.50, 90.0, 0.002),
    Profile("budget", "budget-small", 20, 0.10, 0.40, ("low_cost",), 0.70,
            0.60, 80.0, 0.002),
)
BY_MODEL = {p.model: p for p in PROFILES}
VALIDATED = frozenset(p.model for p in PROFILES if "validated" in p.tags)
DEGRADED = "budget"
# The degradation: ten times slower to the first token and per token, 10 % 503s.
DEGRADE_LATENCY = 10.0
DEGRADE_ERRORS = 0.10


def reply_words(request: dict[str, Any]) -> int:
    """How long the fake's answer is: debugging requests get long answers, chat turns
    medium ones, simple questions short ones (decided from the last user message)."""
    messages = request.get("messages") or []
    last = messages[-1].get("content", "") if messages else ""
    text = last if isinstance(last, str) else ""
    if "Traceback" in text or "diff --git" in text or "def " in text:
        return 220
    return 60 if len(messages) > 1 else 30


def behaviour(profile: Profile, degraded: bool = False) -> Behaviour:
    slow = DEGRADE_LATENCY if degraded else 1.0
    return Behaviour(latency_s=profile.ttfb_s * slow, latency_spread=0.35,
                     tokens_per_s=profile.tokens_per_s / slow,
                     error_rate=DEGRADE_ERRORS if degraded else profile.error_rate,
                     reply_words=reply_words)


@dataclass
class Job:
    """One request (or one conversation, whose turns follow each other) to send at `at`
    seconds after the run starts."""

    at: float
    kind: str
    stream: bool
    messages: list[dict[str, Any]]
    follow_ups: list[str] = field(default_factory=list)
    ident: int = 0


TOPICS = ("photosynthesis", "a hash map", "the Doppler effect", "inflation", "TCP slow start",
          "a bloom filter", "plate tectonics", "the CAP theorem", "compound interest",
          "a mutex", "the placebo effect", "gradient descent", "a load balancer",
          "the water cycle", "an index in a database", "entropy")
CITIES = ("Lisbon", "Kyoto", "Oslo", "Cusco", "Tbilisi", "Hanoi", "Porto", "Quebec")
FOLLOW_UPS = ("What should I pack for it?", "How many days are enough?",
              "Which neighbourhood is best to stay in?", "What is a good day trip from there?",
              "What local dish should I try first?")


def _simple(rng: random.Random, ident: int) -> list[dict[str, Any]]:
    topic = rng.choice(TOPICS)
    return [{"role": "user", "content": f"In one sentence, what is {topic}? (question {ident})"}]


def _code(rng: random.Random, ident: int, functions: int) -> str:
    lines = []
    for n in range(functions):
        lines += [f"def handler_{ident}_{n}(orders, order_id):",
                  "    total = sum(item.price * item.quantity for item in orders[order_id])",
                  f"    if total > {rng.randint(10, 999)}:",
                  "        return apply_discount(total, orders[order_id].customer)",
                  "    return total", ""]
    return "\n".join(lines)


def _debug(rng: random.Random, ident: int) -> list[dict[str, Any]]:
    # One in five is long code (about 3,000 input tokens); the rest a short module.
    code = _code(rng, ident, 60 if rng.random() < 0.2 else 3)
    if rng.random() < 0.5:
        evidence = (f'Traceback (most recent call last):\n  File "orders/handler.py", line '
                    f'{rng.randint(10, 400)}, in handler_{ident}_0\n'
                    "    total = sum(item.price * item.quantity for item in orders[order_id])\n"
                    f"KeyError: 'A-{ident}'")
    else:
        evidence = ("diff --git a/orders/handler.py b/orders/handler.py\n@@ -4,3 +4,3 @@\n"
                    "-    if total > 100:\n+    if total >= 100:\n")
    return [{"role": "user", "content": f"This fails in production, why?\n\n```python\n{code}"
                                        f"\n```\n\n{evidence}\n"}]


def _chat(rng: random.Random, ident: int) -> tuple[list[dict[str, Any]], list[str]]:
    city = rng.choice(CITIES)
    opening = [{"role": "system", "content": "You are a concise travel assistant."},
               {"role": "user", "content": f"I am planning a trip to {city} (trip {ident})."}]
    return opening, rng.sample(FOLLOW_UPS, 3)


def workload(seed: int, duration_s: float, rate: float) -> list[Job]:
    """Poisson arrivals at about `rate` requests per second in all (conversations count
    once per turn): simple 50 %, debugging 20 %, conversation turns 30 % (four turns each);
    a quarter of every kind streamed."""
    rng = random.Random(seed)
    starts_per_s = rate / (0.5 + 0.2 + 0.3 / 4)  # one start per job, not per turn
    jobs: list[Job] = []
    at = 0.0
    while True:
        at += rng.expovariate(starts_per_s)
        if at >= duration_s:
            return jobs
        ident = len(jobs) + 1
        stream = rng.random() < 0.25
        draw = rng.random() * (0.5 + 0.2 + 0.3 / 4)
        if draw < 0.5:
            jobs.append(Job(at, SIMPLE, stream, _simple(rng, ident), ident=ident))
        elif draw < 0.7:
            jobs.append(Job(at, DEBUG, stream, _debug(rng, ident), ident=ident))
        else:
            opening, follow_ups = _chat(rng, ident)
            jobs.append(Job(at, CHAT, stream, opening, follow_ups, ident=ident))


def with_reply(messages: list[dict[str, Any]], reply: str, follow_up: str
               ) -> list[dict[str, Any]]:
    """A conversation's next turn: its history, the assistant's reply and the next
    question (the whole history is resent, as chat clients do)."""
    return [*messages, {"role": "assistant", "content": reply},
            {"role": "user", "content": follow_up}]
