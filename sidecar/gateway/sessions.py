"""Stateful Chat-to-Responses sessions (docs/dialects.md §13): which target a session is
pinned to and the id of its last response.

Keyed by a SHA-256 of (caller name, group, session id), so one caller can never reach
another's session even with the same session id, and the store holds no caller-chosen text.
Bounded twice: entries live `ttl_seconds` from their last turn, and beyond `max_entries`
the least recently used goes. Separate from conversation affinity, which it never reads or
writes (SPEC: "Chat-to-Responses stateful sessions are separate and unchanged"). Clock
injected for tests.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_SESSION_ID_CHARS = 128


@dataclass(frozen=True, slots=True)
class Session:
    target_index: int
    response_id: str | None
    last_used: float


def session_key(caller: str, group: str, session_id: str) -> str:
    return hashlib.sha256(f"{caller}\0{group}\0{session_id}".encode()).hexdigest()


def valid_session_id(value: str) -> bool:
    return (0 < len(value) <= MAX_SESSION_ID_CHARS and value.isascii()
            and value.isprintable())


class SessionStore:
    def __init__(self, ttl_seconds: float = 3600.0, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_seconds
        self._max = max_entries
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        # With fleet sharing (fleet/pins.py): sessions written here since the last round.
        self.journal: list[tuple[str, Session]] | None = None

    @property
    def ttl_seconds(self) -> float:
        return self._ttl

    @property
    def max_entries(self) -> int:
        return self._max

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, key: str) -> Session | None:
        session = self._sessions.get(key)
        if session is None:
            return None
        if self._clock() - session.last_used >= self._ttl:
            del self._sessions[key]
            return None
        return session

    def pin(self, key: str, target_index: int) -> None:
        """A new session's target, before its first answer."""
        self._put(key, Session(target_index, None, self._clock()))

    def answered(self, key: str, response_id: str) -> None:
        """The turn's answer: the next turn continues from it."""
        session = self._sessions.get(key)
        if session is not None:
            self._put(key, Session(session.target_index, response_id, self._clock()))

    def forget(self, key: str) -> None:
        self._sessions.pop(key, None)

    def used_elsewhere(self, key: str, session: Session) -> bool:
        """Another replica's turn of a session (`last_used` on this clock): taken unless
        a later turn is held here or the session has expired."""
        if session.last_used > self._clock():  # never from the future: no longer TTL
            session = Session(session.target_index, session.response_id, self._clock())
        held = self._sessions.get(key)
        if ((held is not None and held.last_used > session.last_used)
                or self._clock() - session.last_used >= self._ttl):
            return False
        self._store(key, session)
        return True

    def _put(self, key: str, session: Session) -> None:
        self._store(key, session)
        if self.journal is not None and len(self.journal) < self._max:
            self.journal.append((key, session))

    def _store(self, key: str, session: Session) -> None:
        self._sessions.pop(key, None)
        self._sessions[key] = session
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
