"""Observations and `retry-after` holds shared between replicas (docs/fleet.md §2).

Each round a replica writes its own counts of its last three slices (the store keeps them
apart for this) into one Redis hash per slice, `<prefix>obs|<width>|<slice>`, field
`<replica>|<target>`, and reads those hashes and the next one back (all live ones on a
resync). Other replicas' entries are merged into the store's slices as replacements, so
reading a slice twice never counts it twice, and the result does not depend on the order
rounds arrive in. Slices are numbered on the wall clock on the wire (replicas' monotonic
clocks differ) and placed in the local ring by a fixed shift taken at start (rounded: any
two replicas' slices are less than one slice apart), so a remote observation lands within
one slice of where it happened.

Holds are the latest "not before" wall time per target (`<prefix>holds`); the store only
ever extends a hold, so merging them is a maximum."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sidecar.observe.slice_counts import from_wire, to_wire
from sidecar.observe.store import ObservationStore

# A hold this much longer than the one published last is published again (holds others
# applied come back slightly later through the clock conversion; this stops the echo).
_HOLD_CHANGE_S = 0.1


class ObservationSharing:
    name = "observations"

    def __init__(self, store: ObservationStore, prefix: str, replica: str,
                 targets: Callable[[], Collection[str]],
                 wall_clock: Callable[[], float] = time.time,
                 clock: Callable[[], float] | None = None) -> None:
        store.share()
        self._store = store
        self._replica = replica
        self._targets = targets
        self._wall = wall_clock
        self._clock = clock if clock is not None else store.clock
        width = store.slice_seconds
        self._width = width
        self._base = f"{prefix}obs|{width}|"
        self._holds_key = f"{prefix}holds"
        # wire slice = local slice + shift (fixed, see the module's docstring): rounded, so
        # a replica's slices start within half a slice of the wall clock's, and any two
        # replicas' within one slice of each other.
        self._shift = round((self._wall() - self._clock()) / width)
        self._live = math.ceil(store.retention_seconds / width) + 1
        self._expiry_s = store.retention_seconds + 3 * width
        self._seen: dict[tuple[str, int, str], bytes] = {}
        self._published_holds: dict[str, float] = {}
        self.merged = 0
        self.unreadable = 0

    def queue(self, pipe: Any, resync: bool) -> tuple[int, Callable[[Sequence[Any]], None]]:
        count = 0
        by_slice: dict[int, dict[str, bytes]] = {}
        for target, number, counts in self._store.own_slices():
            by_slice.setdefault(number + self._shift, {})[f"{self._replica}|{target}"] = (
                to_wire(counts))
        for wire, fields in by_slice.items():
            pipe.hset(self._base + str(wire), mapping=fields)
            pipe.expire(self._base + str(wire), self._expiry_s)
            count += 2
        current = math.floor(self._clock() / self._width) + self._shift
        # Our last three slices and the next: another replica may be a slice ahead or
        # behind, and publishes its last three.
        reads = list(range(current - self._live, current + 2) if resync
                     else range(current - 2, current + 2))
        for wire in reads:
            pipe.hgetall(self._base + str(wire))
        holds = self._holds_to_publish()
        if holds:
            pipe.hset(self._holds_key, mapping={t: repr(u) for t, u in holds.items()})
            pipe.expire(self._holds_key, 3600)
        pipe.hgetall(self._holds_key)
        written = count

        def absorb(answers: Sequence[Any]) -> None:
            known = self._targets()
            for wire, entries in zip(reads, answers[written:written + len(reads)],
                                     strict=True):
                self._absorb_slice(wire, entries, known)
            self._absorb_holds(answers[-1], known)

        return written + len(reads) + (2 if holds else 0) + 1, absorb

    def _absorb_slice(self, wire: int, entries: dict[bytes, bytes],
                      known: Collection[str]) -> None:
        for field, raw in entries.items():
            replica, _, target = field.decode(errors="replace").partition("|")
            if replica == self._replica or target not in known:
                continue
            seen_key = (replica, wire, target)
            if self._seen.get(seen_key) == raw:
                continue  # unchanged since the last round
            counts = from_wire(raw)
            if counts is None:
                self.unreadable += 1
                continue
            if self._store.merge_remote(target, (replica, wire), wire - self._shift, counts):
                self.merged += 1
                self._seen[seen_key] = raw
        oldest = math.floor(self._clock() / self._width) + self._shift - self._live
        for key in [k for k in self._seen if k[1] < oldest]:
            del self._seen[key]

    def _holds_to_publish(self) -> dict[str, float]:
        """This replica's holds (in wall time) that are new or longer than published."""
        offset = self._wall() - self._clock()
        fresh = {}
        for target, until in self._store.holds().items():
            wall_until = until + offset
            if wall_until > self._published_holds.get(target, 0.0) + _HOLD_CHANGE_S:
                fresh[target] = self._published_holds[target] = wall_until
        return fresh

    def _absorb_holds(self, entries: dict[bytes, bytes], known: Collection[str]) -> None:
        now = self._wall()
        for field, raw in entries.items():
            target = field.decode(errors="replace")
            if target not in known:
                continue
            try:
                wall_until = float(raw)
            except ValueError:
                self.unreadable += 1
                continue
            wait = wall_until - now
            if wait > 0 and math.isfinite(wait):
                self._store.rate_limited(target, wait)
                # what we would publish for it is the same hold: no echo
                self._published_holds[target] = max(self._published_holds.get(target, 0.0),
                                                    wall_until)
