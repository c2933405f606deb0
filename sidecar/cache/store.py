"""One group's cached answers: bounded by entry count and total bytes (least recently used
go first), each served for `ttl_seconds` from when it was stored — a hit does not extend
it. Clock injected, so tests need no sleeps."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.strategy_policies import ResponseCache

# Answers a round sends to other replicas at most (more stored between two rounds stay
# local): the channel's bytes per round stay bounded by this × `max_entry_bytes`.
JOURNAL_ENTRIES = 64


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
        # With `fleet: true` (fleet/answers.py): answers stored here since the last round.
        self.journal: list[tuple[bytes, CachedAnswer]] | None = None

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
        answer = CachedAnswer(body, content_type, self._clock())
        self._keep(key, answer)
        if self.journal is not None and len(self.journal) < JOURNAL_ENTRIES:
            self.journal.append((key, answer))
        return True

    def put_elsewhere(self, key: bytes, answer: CachedAnswer) -> bool:
        """Another replica's answer (`stored_at` on this clock): kept unless it is too large,
        has expired, or a newer answer for the key is held; its TTL runs from when it was
        first stored (a hit, or sharing, does not extend it)."""
        if answer.stored_at > self._clock():  # never from the future: no longer TTL
            answer = CachedAnswer(answer.body, answer.content_type, self._clock())
        held = self._answers.get(key)
        if (len(answer.body) > self.policy.max_entry_bytes
                or self._clock() - answer.stored_at >= self.policy.ttl_seconds
                or (held is not None and held.stored_at > answer.stored_at)):
            return False
        self._keep(key, answer)
        return True

    def _keep(self, key: bytes, answer: CachedAnswer) -> None:
        if key in self._answers:
            self._drop(key)
        self._answers[key] = answer
        self.bytes += len(answer.body)
        while (len(self._answers) > self.policy.max_entries
               or self.bytes > self.policy.max_bytes):
            self._drop(next(iter(self._answers)))
            self.evictions += 1

    def _drop(self, key: bytes) -> None:
        self.bytes -= len(self._answers.pop(key).body)
