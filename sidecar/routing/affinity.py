"""Conversation affinity: pin a conversation's first selected target, process-local.

A pin maps a SHA-256 conversation key (never the text) to a target index. It lives
`ttl_seconds` from when it was created or replaced — hits do not extend it — and when the
store is full the oldest created/replaced pin goes first (FIFO, not LRU). Lookups and
inserts are O(1); memory is bounded by `max_entries`. The clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from enum import StrEnum

Clock = Callable[[], float]


class AffinityOutcome(StrEnum):
    HIT = "hit"
    MISS_CREATED = "miss_created"
    EXPIRED_REPLACED = "expired_replaced"
    INELIGIBLE_REPLACED = "ineligible_replaced"
    DISABLED = "disabled"
    NOT_APPLICABLE = "not_applicable"


class AffinityStore:
    __slots__ = ("_clock", "_max_entries", "_pins", "_ttl", "journal")

    def __init__(self, ttl_seconds: float, max_entries: int, clock: Clock = time.monotonic):
        self._ttl = ttl_seconds
        self._max_entries = max_entries
        self._clock = clock
        self._pins: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        # With fleet sharing (fleet/pins.py): pins made here since the last round, as
        # (key, index, created); at most `max_entries` of them are kept.
        self.journal: list[tuple[bytes, int, float]] | None = None

    @property
    def ttl_seconds(self) -> float:
        return self._ttl

    @property
    def max_entries(self) -> int:
        return self._max_entries

    def __len__(self) -> int:
        return len(self._pins)

    def lookup(self, key: bytes) -> tuple[int | None, bool]:
        """(pinned target index or None, expired). Never extends a pin's life."""
        pin = self._pins.get(key)
        if pin is None:
            return None, False
        index, created = pin
        return index, self._clock() - created >= self._ttl

    def pin(self, key: bytes, index: int) -> None:
        """Create or replace: the pin's TTL starts now and it becomes the newest entry."""
        if key in self._pins:
            del self._pins[key]
        elif len(self._pins) >= self._max_entries:
            self._pins.popitem(last=False)
        created = self._clock()
        self._pins[key] = (index, created)
        if self.journal is not None and len(self.journal) < self._max_entries:
            self.journal.append((key, index, created))

    def pinned_elsewhere(self, key: bytes, index: int, created: float) -> bool:
        """Another replica's pin (its creation time on this clock): taken unless a newer
        pin for the key is held here or it has already expired; it keeps its creation
        time (TTL is not extended by sharing either)."""
        created = min(created, self._clock())  # never from the future: no longer TTL
        held = self._pins.get(key)
        if (held is not None and held[1] > created) or self._clock() - created >= self._ttl:
            return False
        if held is not None:
            del self._pins[key]
        elif len(self._pins) >= self._max_entries:
            self._pins.popitem(last=False)
        self._pins[key] = (index, created)
        return True

    def adopt(self, previous: AffinityStore, index_map: dict[int, int]) -> None:
        """A reload's carry-over: `previous`'s pins to targets that stayed the same
        (old index → new index), oldest first, keeping their creation time (a reload does
        not extend a TTL); pins to removed or changed targets are dropped."""
        for key, (index, created) in previous._pins.items():
            if index in index_map:
                self._pins[key] = (index_map[index], created)
        while len(self._pins) > self._max_entries:
            self._pins.popitem(last=False)

    def digests(self) -> list[bytes]:
        """Oldest first (for tests and diagnostics; digests only)."""
        return list(self._pins)
