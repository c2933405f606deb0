"""The response caches of all groups that have one, and the slots that tie an answer on its
way back to its entry (docs/cache.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from sidecar.cache.keys import cache_key
from sidecar.cache.slots import Slots
from sidecar.cache.store import AnswerStore, CachedAnswer
from sidecar.config.models import SidecarConfig
from sidecar.dialects.apis import Dialect

# Misses waiting for their answer at once; beyond it the oldest is not stored.
MAX_SLOTS = 10_000


def cached_groups(config: SidecarConfig) -> list[str]:
    return [name for name, group in config.models.items() if group.caches_responses]


class ResponseCaches:
    def __init__(self, config: SidecarConfig, max_request_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._shared = {name: config.models[name].response_cache.shared  # type: ignore[union-attr]
                        for name in cached_groups(config)}
        self.stores = {name: AnswerStore(config.models[name].response_cache, clock)  # type: ignore[arg-type]
                       for name in self._shared}
        self._max_request_s = max_request_s
        self.slots = Slots(MAX_SLOTS, max_request_s, clock)

    @classmethod
    def for_config(cls, config: SidecarConfig, max_request_s: float,
                   previous: ResponseCaches | None = None) -> ResponseCaches | None:
        """The caches `config` needs (None: no group has one), keeping what `previous`
        (the configuration before a reload) holds that still applies."""
        if not cached_groups(config):
            return None
        caches = cls(config, max_request_s)
        if previous is not None:
            caches.carry_over(previous)
        return caches

    def carry_over(self, previous: ResponseCaches) -> None:
        """After a reload: a group whose cache settings did not change keeps its answers
        (its targets may have: an answer stays an answer), and misses under way still find
        their slots."""
        for group, store in previous.stores.items():
            if group in self.stores and store.policy == self.stores[group].policy:
                self.stores[group] = store
        self.slots = previous.slots
        self.slots.max_age_s = self._max_request_s

    def __contains__(self, group: str) -> bool:
        return group in self.stores

    def key(self, group: str, caller: str, dialect: Dialect, payload: Mapping[str, Any],
            headers: tuple[tuple[str, str], ...] = ()) -> bytes:
        return cache_key(group, None if self._shared[group] else caller, dialect, payload,
                         headers)

    def lookup(self, group: str, key: bytes) -> CachedAnswer | None:
        return self.stores[group].get(key)

    def store(self, slot: str, body: bytes, content_type: str) -> bool:
        """An answer that came back for `slot` (2xx, unencoded, not streamed)."""
        entry = self.slots.take(slot)
        if entry is None:
            return False
        group, key = entry
        store = self.stores.get(group)
        return store is not None and store.put(key, body, content_type)

    def gauges(self) -> dict[str, float]:
        return {"response_cache_slots": float(len(self.slots)),
                "response_cache_slots_dropped": float(self.slots.dropped)}
