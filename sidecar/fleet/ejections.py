"""Ejections and re-entries shared between replicas (docs/fleet.md §2).

A target ejected by one replica is ejected by all within one round; one brought back by
one replica's probes is back on all. Each group's latest event per target sits in the
Redis hash `<prefix>ej|<group>`, field the target label, value
`{"u": ejected until (wall) or null for back in, "c": count, "a": when (wall), "r": replica}`.
A replica applies another's event only when it is newer than the last event it saw or
made for that target, so the latest decision anywhere wins and none is applied twice."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.routing.ejection import Ejections

# Longer than any ejection lasts (a third of the longest window, 3,600 s at most).
_EXPIRY_S = 7_200
MAX_EVENT_BYTES = 1_024


class EjectionSharing:
    name = "ejections"

    def __init__(self, prefix: str, replica: str,
                 groups: Callable[[], dict[str, tuple[Ejections, frozenset[str]]]],
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """`groups`: the current configuration's ejection states by group, with the labels
        of the group's targets (a reload replaces them; each is journalled from the first
        round that sees it; events for other labels are ignored)."""
        self._prefix = prefix
        self._replica = replica
        self._groups = groups
        self._clock = clock
        self._wall = wall_clock
        self._latest: dict[tuple[str, str], float] = {}  # (group, label) → newest event
        self._states: dict[str, int] = {}  # group → id of the Ejections last seen
        self.applied = 0
        self.unreadable = 0

    def queue(self, pipe: Any, resync: bool) -> tuple[int, Callable[[Sequence[Any]], None]]:
        groups = self._groups()
        offset = self._wall() - self._clock()
        count = 0
        for group, (ejections, _labels) in groups.items():
            if self._states.get(group) != id(ejections):
                # A reload gave the group a fresh state: the fleet's live ejections apply
                # to it again.
                self._states[group] = id(ejections)
                for seen in [k for k in self._latest if k[0] == group]:
                    del self._latest[seen]
            journal = ejections.journal
            if journal is None:
                ejections.journal = []
                continue
            if not journal:
                continue
            at = self._wall()
            fields = {}
            for label, until, times in journal:
                event = {"u": None if until is None else until + offset, "c": times,
                         "a": at, "r": self._replica}
                fields[label] = json.dumps(event, separators=(",", ":"))
                self._latest[(group, label)] = at
            journal.clear()
            key = f"{self._prefix}ej|{group}"
            pipe.hset(key, mapping=fields)
            pipe.expire(key, _EXPIRY_S)
            count += 2
        names = list(groups)
        for group in names:
            pipe.hgetall(f"{self._prefix}ej|{group}")

        def absorb(answers: Sequence[Any]) -> None:
            for group, entries in zip(names, answers[count:], strict=True):
                ejections, labels = groups[group]
                for field, raw in entries.items():
                    label = field.decode(errors="replace")
                    if label in labels:
                        self._apply(group, ejections, label, raw)

        return count + len(names), absorb

    def _apply(self, group: str, ejections: Ejections, label: str, raw: bytes) -> None:
        event = _event(raw)
        if event is None:
            self.unreadable += 1
            return
        until, times, at, replica = event
        if replica == self._replica or at <= self._latest.get((group, label), -math.inf):
            return
        self._latest[(group, label)] = at
        now = self._clock()
        if until is None:
            ejections.reentered_elsewhere(label, now)
        else:
            local_until = until - (self._wall() - now)
            if local_until > now:
                ejections.ejected_elsewhere(label, local_until, times)
        self.applied += 1


def _event(raw: bytes) -> tuple[float | None, int, float, str] | None:
    if len(raw) > MAX_EVENT_BYTES:
        return None
    try:
        data = json.loads(raw)
        until, times, at, replica = data["u"], data["c"], data["a"], data["r"]
    except (ValueError, KeyError, TypeError):
        return None
    if (until is not None and not _finite(until)) or not _finite(at):
        return None
    if type(times) is not int or not 0 < times < 1_000 or not isinstance(replica, str):
        return None
    return until, times, at, replica


def _finite(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
