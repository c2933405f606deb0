"""Conversation pins and Chat-to-Responses sessions shared between replicas
(docs/fleet.md §3), so a follow-up turn finds its target on any replica.

New entries go to a Redis stream each (`<prefix>pins`, `<prefix>sessions`), trimmed to
about the stores' own bound (`XADD … MAXLEN ~`); each replica reads both streams from its
cursor every round (at most `max_shared_per_round` entries) and stores what it has not
seen, keeping the creation time (pins) or last turn (sessions) as written: TTLs are not
extended by sharing. Keys are what the stores already hold, SHA-256 digests that cover
caller and group, so isolation between callers is unchanged; no text travels."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.fleet.redis_client import as_text
from sidecar.gateway.sessions import Session, SessionStore
from sidecar.routing.affinity import AffinityStore

_FROM_THE_START = "0-0"  # a new replica reads what the stream still holds
MAX_RESPONSE_ID_CHARS = 256


class PinSharing:
    name = "pins"

    def __init__(self, prefix: str, replica: str,
                 groups: Callable[[], dict[str, tuple[AffinityStore, tuple[str, ...]]]],
                 sessions: Callable[[], SessionStore], max_per_round: int,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`groups`: each group's pins with its targets' labels in index order."""
        self._pins_key = f"{prefix}pins"
        self._sessions_key = f"{prefix}sessions"
        self._replica = replica
        self._groups = groups
        self._sessions = sessions
        self._max = max_per_round
        self._clock = clock
        self._wall = wall_clock
        self._cursors = {self._pins_key: _FROM_THE_START,
                         self._sessions_key: _FROM_THE_START}
        self.adopted = 0
        self.unreadable = 0

    def queue(self, pipe: Any, resync: bool) -> tuple[int, Callable[[Sequence[Any]], None]]:
        groups = self._groups()
        sessions = self._sessions()
        offset = self._wall() - self._clock()
        count = 0
        bound = min(1_000_000, sum(pins_.max_entries for pins_, _ in groups.values()) + 1_000)
        for group, (pins, labels) in groups.items():
            if pins.journal is None:
                pins.journal = []
                continue
            for key, index, created in pins.journal:
                pipe.xadd(self._pins_key, {"g": group, "k": key, "t": labels[index],
                                           "c": repr(created + offset), "r": self._replica},
                          maxlen=bound, approximate=True)
                count += 1
            pins.journal.clear()
        if sessions.journal is None:
            sessions.journal = []
        else:
            for key, session in sessions.journal:
                pipe.xadd(self._sessions_key, {
                    "k": key, "i": session.target_index, "p": session.response_id or "",
                    "u": repr(session.last_used + offset), "r": self._replica},
                    maxlen=sessions.max_entries + 1_000, approximate=True)
                count += 1
            sessions.journal.clear()
        pipe.xread(dict(self._cursors), count=self._max)

        def absorb(answers: Sequence[Any]) -> None:
            offset_now = self._wall() - self._clock()
            for stream, entries in answers[count] or []:
                name = as_text(stream)
                for entry_id, fields in entries:
                    self._cursors[name] = as_text(entry_id)
                    if name == self._pins_key:
                        self._adopt_pin(fields, groups, offset_now)
                    else:
                        self._adopt_session(fields, sessions, offset_now)

        return count + 1, absorb

    def _adopt_pin(self, fields: dict[bytes, bytes],
                   groups: dict[str, tuple[AffinityStore, tuple[str, ...]]],
                   offset: float) -> None:
        if fields.get(b"r", b"").decode(errors="replace") == self._replica:
            return
        try:
            group = fields[b"g"].decode()
            key = fields[b"k"]
            label = fields[b"t"].decode()
            created = float(fields[b"c"]) - offset
        except (KeyError, ValueError):
            self.unreadable += 1
            return
        held = groups.get(group)
        if held is None or len(key) != 32 or not math.isfinite(created):
            return
        pins, labels = held
        if label in labels and pins.pinned_elsewhere(key, labels.index(label), created):
            self.adopted += 1

    def _adopt_session(self, fields: dict[bytes, bytes], sessions: SessionStore,
                       offset: float) -> None:
        if fields.get(b"r", b"").decode(errors="replace") == self._replica:
            return
        try:
            key = fields[b"k"].decode()
            index = int(fields[b"i"])
            response_id = fields[b"p"].decode()
            last_used = float(fields[b"u"]) - offset
        except (KeyError, ValueError):
            self.unreadable += 1
            return
        if (len(key) != 64 or not 0 <= index < 10_000 or not math.isfinite(last_used)
                or len(response_id) > MAX_RESPONSE_ID_CHARS):
            self.unreadable += 1
            return
        if sessions.used_elsewhere(key, Session(index, response_id or None, last_used)):
            self.adopted += 1
