"""Which cache entry an answer on its way back belongs to.

A miss is forwarded through the target's cache cluster, whose upstream ext_proc sees the
answer (docs/cache.md §3). That hook cannot see the caller, so the router-level decision
reserves a *slot* — a random id standing for (group, key) — and the request carries it in
`x-sidecar-cache-slot`. The id is random, so it tells the provider nothing. Slots are
bounded (the oldest go first) and expire with the longest request."""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable


class Slots:
    def __init__(self, max_slots: int, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_slots
        self.max_age_s = max_age_s  # a reload may lengthen it
        self._clock = clock
        self._slots: OrderedDict[str, tuple[str, bytes, float]] = OrderedDict()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._slots)

    def reserve(self, group: str, key: bytes) -> str:
        slot = os.urandom(16).hex()
        now = self._clock()
        self._slots[slot] = (group, key, now)
        while self._slots:
            oldest, (_, _, at) = next(iter(self._slots.items()))
            if len(self._slots) <= self._max and now - at < self.max_age_s:
                break
            del self._slots[oldest]
            self.dropped += 1
        return slot

    def take(self, slot: str) -> tuple[str, bytes] | None:
        """The slot's (group, key), once: the first successful attempt stores."""
        entry = self._slots.pop(slot, None)
        if entry is None or self._clock() - entry[2] >= self.max_age_s:
            return None
        return entry[0], entry[1]
