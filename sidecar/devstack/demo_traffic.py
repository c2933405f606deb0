"""Demo traffic (`sidecar demo-traffic`, and `sidecar up`'s demo unless
`--no-demo-traffic`): a steady mix of requests through the client listener, as the
ordinary SDKs send them, so the console shows routing at work (docs/console.md).

The mix: simple questions, code work (a stack trace with its code, a diff: `complex` for
the complexity signal), each a conversation of its own; six multi-turn conversations that
grow turn by turn (affinity pins them); and Anthropic Messages requests to the
`claude-agent` group; some of each streamed.
Seeded, at a fixed average rate, with at most `max_in_flight` requests open (a slow target
cannot make it pile up).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger("sidecar.demo")

SIMPLE = ("What is the capital of Portugal?", "Give me a synonym for quick.",
          "How many days are in a leap year?", "Translate 'good morning' to Spanish.",
          "Name three primary colours.", "What does HTTP stand for?")
CODE = (
    "Fix this bug. The function:\n```python\ndef total(items):\n    return sum(i['price'] "
    "for i in items)\n```\nTraceback (most recent call last):\n  File \"shop.py\", line 2, "
    "in total\nKeyError: 'price'\n",
    "Review this change for security problems:\n```diff\n--- a/app.py\n+++ b/app.py\n@@ -1,3 "
    "+1,4 @@\n def login(user, password):\n-    return check(user, password)\n+    query = "
    "f\"SELECT * FROM users WHERE name = '{user}'\"\n+    return db.execute(query)\n```\n",
    "Refactor this code and explain the diff:\n```python\nclass Cart:\n    def __init__(self):"
    "\n        self.items = []\n    def add(self, item):\n        self.items.append(item)\n```"
    "\n",
)
TURNS = ("Let's plan a three-day trip to Lisbon.", "What should we do on the second day?",
         "Where can we eat near Alfama?", "And if it rains?", "Summarise the plan.",
         "Thanks! One more idea for the last evening?")
CONVERSATIONS = 6


@dataclass
class DemoTraffic:
    base_url: str                # the client listener, e.g. http://127.0.0.1:10000
    token: str
    rate_per_s: float = 3.0
    seed: int = 0
    max_in_flight: int = 16
    sent: Counter[str] = field(default_factory=Counter)
    answered: Counter[int] = field(default_factory=Counter)
    _turns: list[list[dict[str, str]]] = field(default_factory=list)
    _asked: int = 0

    async def run(self, requests: int | None = None) -> None:
        """Until cancelled (or `requests` sent)."""
        chance = random.Random(self.seed)
        slots = asyncio.Semaphore(self.max_in_flight)
        self._turns = [[] for _ in range(CONVERSATIONS)]
        tasks: set[asyncio.Task[None]] = set()
        timeout = httpx.Timeout(60.0, connect=5.0)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout) as client:
            try:
                count = 0
                while requests is None or count < requests:
                    await asyncio.sleep(chance.expovariate(self.rate_per_s))
                    if slots.locked():
                        self.sent["skipped_busy"] += 1
                        continue
                    await slots.acquire()
                    kind, path, body = self._next(chance)
                    self.sent[kind] += 1
                    task = asyncio.ensure_future(self._send(client, path, body, slots))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    count += 1
                if tasks:
                    await asyncio.wait(tasks)
            finally:
                for task in tasks:
                    task.cancel()

    def _next(self, chance: random.Random) -> tuple[str, str, dict[str, Any]]:
        draw = chance.random()
        stream = chance.random() < 0.3
        # A first turn is its own conversation, as in real traffic: numbered, so no two
        # share an opening (the same opening is the same conversation to affinity, whose
        # pinned turns never carry a probe: a handful of repeated questions would pin all
        # traffic and keep an ejected target from ever being probed).
        self._asked += 1
        if draw < 0.35:
            kind, messages = "simple", [{"role": "user", "content":
                                         f"{chance.choice(SIMPLE)} (question {self._asked})"}]
        elif draw < 0.6:
            kind, messages = "code", [{"role": "user", "content":
                                       f"Task {self._asked}. {chance.choice(CODE)}"}]
        elif draw < 0.85:
            kind, messages = "conversation", self._turn(chance.randrange(CONVERSATIONS))
        else:
            body: dict[str, Any] = {"model": "claude-agent", "max_tokens": 256,
                                    "messages": [{"role": "user", "content":
                                                  f"{chance.choice(SIMPLE)} (question "
                                                  f"{self._asked})"}]}
            if stream:
                body["stream"] = True
            return "anthropic", "/v1/messages", body
        body = {"model": "adaptive-agent", "messages": messages}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return kind, "/v1/chat/completions", body

    def _turn(self, index: int) -> list[dict[str, str]]:
        """The conversation's next turn: its history so far and the next question (the
        answers stand in as short assistant turns); it starts over after its last turn."""
        history = self._turns[index]
        if len(history) >= 2 * len(TURNS):
            history.clear()
        asked = len(history) // 2
        history.append({"role": "user", "content": f"{TURNS[asked]} (conversation {index})"})
        messages = list(history)
        history.append({"role": "assistant", "content": "Here is a suggestion."})
        return messages

    async def _send(self, client: httpx.AsyncClient, path: str, body: dict[str, Any],
                    slots: asyncio.Semaphore) -> None:
        headers = {"authorization": f"Bearer {self.token}"}
        if path == "/v1/messages":
            headers = {"x-api-key": self.token, "anthropic-version": "2023-06-01"}
        try:
            async with client.stream("POST", path, json=body, headers=headers) as response:
                async for _ in response.aiter_bytes():
                    pass
                self.answered[response.status_code] += 1
        except httpx.HTTPError as exc:
            self.answered[0] += 1
            log.debug("demo traffic: %s", type(exc).__name__)
        finally:
            slots.release()
