"""Response-cache answers shared between replicas, for groups with `response_cache.fleet`
(docs/fleet.md §3a): an answer cached on one replica is a hit on every replica from the
next round on, with no Redis call on the request path.

New answers go to one Redis stream per group (`<prefix>cache|<group>`, trimmed to about
`min(max_entries, 1000)` entries); each replica reads the streams from its cursor every
round, at most `JOURNAL_ENTRIES` answers per group and round, and stores them in its own
cache under the same key (a SHA-256 over group, caller unless `shared`, dialect and the
request: isolation between callers is the local cache's), with the answer's first
storage time (TTL as written) and within the group's local bounds."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.cache.caches import ResponseCaches
from sidecar.cache.store import JOURNAL_ENTRIES, AnswerStore, CachedAnswer
from sidecar.fleet.redis_client import as_text

_STREAM_ENTRIES = 1_000
_MAX_CONTENT_TYPE = 200


class AnswerSharing:
    name = "answers"

    def __init__(self, prefix: str, replica: str,
                 caches: Callable[[], ResponseCaches | None],
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._prefix = prefix
        self._replica = replica
        self._caches = caches
        self._clock = clock
        self._wall = wall_clock
        self._cursors: dict[str, str] = {}
        self.adopted = 0
        self.unreadable = 0

    def queue(self, pipe: Any, resync: bool) -> tuple[int, Callable[[Sequence[Any]], None]]:
        caches = self._caches()
        stores = {group: store for group, store in (caches.stores.items() if caches else ())
                  if store.policy.fleet}
        offset = self._wall() - self._clock()
        count = 0
        for group, store in stores.items():
            if store.journal is None:
                store.journal = []
                continue
            for key, answer in store.journal:
                pipe.xadd(f"{self._prefix}cache|{group}", {
                    "k": key, "b": answer.body, "t": answer.content_type,
                    "s": repr(answer.stored_at + offset), "r": self._replica},
                    maxlen=min(store.policy.max_entries, _STREAM_ENTRIES), approximate=True)
                count += 1
            store.journal.clear()
        streams = {f"{self._prefix}cache|{group}": group for group in stores}
        if streams:
            pipe.xread({name: self._cursors.get(name, "0-0") for name in streams},
                       count=JOURNAL_ENTRIES)

        def absorb(answers: Sequence[Any]) -> None:
            if not streams:
                return
            offset_now = self._wall() - self._clock()
            for stream, entries in answers[count] or []:
                name = as_text(stream)
                store = stores.get(streams.get(name, ""))
                for entry_id, fields in entries:
                    self._cursors[name] = as_text(entry_id)
                    if store is not None:
                        self._adopt(store, fields, offset_now)

        return count + (1 if streams else 0), absorb

    def _adopt(self, store: AnswerStore, fields: dict[bytes, bytes], offset: float) -> None:
        if fields.get(b"r", b"").decode(errors="replace") == self._replica:
            return
        try:
            key, body = fields[b"k"], fields[b"b"]
            content_type = fields[b"t"].decode()
            stored_at = float(fields[b"s"]) - offset
        except (KeyError, ValueError):
            self.unreadable += 1
            return
        if (len(key) != 32 or len(content_type) > _MAX_CONTENT_TYPE
                or not content_type.isprintable() or not math.isfinite(stored_at)):
            self.unreadable += 1
            return
        if store.put_elsewhere(key, CachedAnswer(body, content_type, stored_at)):
            self.adopted += 1
