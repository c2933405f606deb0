"""One group's cached answers: bounded by entry count and total bytes (least recently used
go first), each served for `ttl_seconds` from when it was stored — a hit does not extend
it. Clock injected, so tests need no sleeps."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.strategy_policies import ResponseCache


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    body: bytes
    content_type: str
    stored_at: float


class AnswerStore:
    def __init__(self, policy: ResponseCache,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._answers: OrderedDict[bytes, CachedAnswer] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: bytes) -> CachedAnswer | None:
        answer = self._answers.get(key)
        if answer is not None and self._clock() - answer.stored_at >= self.policy.ttl_seconds:
            self._drop(key)
            answer = None
        if answer is None:
            self.misses += 1
            return None
        self._answers.move_to_end(key)
        self.hits += 1
        return answer

    def put(self, key: bytes, body: bytes, content_type: str) -> bool:
        """Store an answer; False when it is larger than `max_entry_bytes`."""
        if len(body) > self.policy.max_entry_bytes:
            return False
        if key in self._answers:
            self._drop(key)
        self._answers[key] = CachedAnswer(body, content_type, self._clock())
        self.bytes += len(body)
        while (len(self._answers) > self.policy.max_entries
               or self.bytes > self.policy.max_bytes):
            self._drop(next(iter(self._answers)))
            self.evictions += 1
        return True

    def _drop(self, key: bytes) -> None:
        self.bytes -= len(self._answers.pop(key).body)
