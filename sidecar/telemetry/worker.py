"""The telemetry worker: a child process of the sidecar that joins, builds, counts, traces
and stores the rows (docs/telemetry.md §3).

Why a process: in the sidecar's own process every microsecond of row work, whichever
thread did it, was taken from the event loop by the interpreter lock; measured at +35 %
sidecar CPU per request (bench/results/telemetry_cost.md, before). Here the sidecar only
hands over plain tuples (handoff.py), and this process has its own interpreter.

It reads one Unix SEQPACKET socket inherited from the sidecar: the first message is the
start settings (`Start`, pickled: it comes from the parent, never from a peer), then
batches of marshalled `(kind, record)` items in the order things happened — `d` a decision, `r`
an access-log result, `f` a fallback transition, `p` a reloaded configuration's prices.
When and how fast it reads, and its status reports back, are intake.py's. End of input
(the sidecar closed its end, or died) means: write what is buffered, send the last
status, exit. SIGINT and SIGTERM
are ignored: a Ctrl-C or a pod's SIGTERM reaches the sidecar, which closes the socket
after its own last hand-over, so no row is cut off.

Usage (by handoff.py only):  python -m sidecar.telemetry.worker FD
"""

from __future__ import annotations

import gc
import marshal
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sidecar.config.service_settings import Telemetry
from sidecar.operations.log_format import configure
from sidecar.telemetry.database import open_database
from sidecar.telemetry.deferral import CpuPressure, Deferral
from sidecar.telemetry.encode import RowEncoder
from sidecar.telemetry.intake import MAX_MESSAGE, Intake
from sidecar.telemetry.join import Joiner
from sidecar.telemetry.replica import replica_name
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.row_counts import RowCounts, count_row
from sidecar.telemetry.rows import (
    CanaryEventRow,
    DecisionRecord,
    FallbackRow,
    JoinedRequest,
    MirrorRow,
    Price,
    ShadowRow,
    request_row,
)
from sidecar.telemetry.schema import (
    canary_values,
    fallback_values,
    mirror_values,
    shadow_values,
)
from sidecar.telemetry.store import TelemetryStore
from sidecar.telemetry.writer import (
    CANARY,
    FALLBACK,
    MIRROR,
    REQUEST,
    SHADOW,
    Pacing,
    Prepared,
    TelemetryWriter,
)


@dataclass(frozen=True)
class Start:
    settings: Telemetry
    max_age_s: float                         # the longest a request can take (join.py)
    prices: dict[str, tuple[float, ...]]   # rows.price_records
    log_level: str
    log_format: str                          # text or json (operations/log_format.py)
    close_timeout_s: float = 5.0


def prices_of(records: dict[str, tuple[float, ...]]) -> dict[str, Price]:
    return {target: Price(*record) for target, record in records.items()}


class Worker:
    """The join, the encoder, the counters and the writer, fed by `take`."""

    def __init__(self, start: Start, writer: TelemetryWriter | None = None) -> None:
        settings = start.settings
        replica = replica_name(settings.replica)
        store = TelemetryStore(open_database(settings), replica, settings.raw_retention_days)
        self.encoder = RowEncoder(replica, prices_of(start.prices))
        self.counts: RowCounts = Counter()
        self._counting = threading.Lock()
        self.spans = None
        if settings.traces is not None:
            from sidecar.telemetry.traces import RequestSpans

            self.spans = RequestSpans(settings.traces)
        background = settings.worker_priority == "background"
        self.writer = writer or TelemetryWriter(
            store, queue_size=settings.queue_size, prepare=self._prepare,
            maintenance_interval_s=settings.rollup_interval_minutes * 60,
            pacing=Pacing() if background else None)
        self.joiner = Joiner(self._emit, max_pending=settings.max_pending,
                             max_age_s=start.max_age_s)
        # In the background, input waits while the CPUs are contended (deferral.py).
        self.deferral = Deferral() if background else None

    def _prepare(self, item: JoinedRequest | FallbackRow | ShadowRow | CanaryEventRow | MirrorRow
                 ) -> Prepared:
        """On the writer thread: the row's values, counted (and traced) as they are made."""
        if isinstance(item, ShadowRow):
            return SHADOW, shadow_values(self.encoder.replica, item)
        if isinstance(item, CanaryEventRow):
            return CANARY, canary_values(self.encoder.replica, item)
        if isinstance(item, MirrorRow):
            return MIRROR, mirror_values(self.encoder.replica, item)
        with self._counting:  # counted on the writer thread, reported on the reading one
            if isinstance(item, FallbackRow):
                count_row(self.counts, item)
                return FALLBACK, fallback_values(self.encoder.replica, item)
            values = self.encoder.request(item, self.counts)
        if self.spans is not None:
            self.spans.record(request_row(item.record, item.result, self.encoder.prices,
                                          item.join, item.at))
        return REQUEST, values

    def _emit(self, item: JoinedRequest | FallbackRow | ShadowRow | CanaryEventRow | MirrorRow
              ) -> None:
        if not self.writer.offer(item):  # full: the row is lost, its counters are not
            self._prepare(item)

    def take(self, batch: list[bytes]) -> None:
        """One message: the items, each marshalled on its own (handoff.py)."""
        joiner = self.joiner
        for item in batch:
            kind, record = marshal.loads(item)
            if kind == "d":
                joiner.decided(DecisionRecord(*record))
            elif kind == "r":
                joiner.finished(RequestResult(*record))
            elif kind == "f":
                self._emit(FallbackRow(*record))
            elif kind == "s":
                self._emit(ShadowRow(*record))
            elif kind == "c":
                self._emit(CanaryEventRow(*record))
            elif kind == "m":
                self._emit(MirrorRow(*record))
            elif kind == "p":  # a reload (handoff.reconfigure)
                prices, max_age_s = record
                self.encoder.reprice(prices_of(prices))
                self.joiner.max_age_s = max_age_s

    def status(self) -> dict[str, Any]:
        """What the sidecar shows in /metrics; the counts are those made since the last
        status (`unsent` gives them back when it could not be sent)."""
        with self._counting:
            counts, self.counts = self.counts, Counter()
        writer, joiner = self.writer, self.joiner
        return {"depth": writer.depth, "dropped": dict(writer.dropped),
                "deferrals": self.deferral.deferrals if self.deferral else 0,
                "written": writer.written, "pending": len(joiner), "evicted": joiner.evicted,
                "counts": dict(counts)}

    def unsent(self, status: dict[str, Any]) -> None:
        with self._counting:
            self.counts.update(status["counts"])


def run_in_background() -> None:
    """Only on CPU nothing else wants: a process of the sidecar's own scheduling group that
    wakes up preempts this one at once (SCHED_IDLE), where a nice value would still share
    time slices with it. Processes in other groups (Envoy in its own session or container)
    compete with the group as a whole; for them the writer's pacing keeps each of this
    process's runs short (writer.py), and the intake leaves its input waiting while the
    CPUs are contended (intake.py, docs/telemetry.md §8)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        os.nice(19)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = socket.socket(fileno=int(argv[1]))
    start: Start = pickle.loads(channel.recv(MAX_MESSAGE))
    if start.settings.worker_priority == "background":
        run_in_background()
    configure(start.log_level, start.log_format)
    worker = Worker(start)
    # What exists now lives as long as the process: out of the collector's way. The rows
    # hold no cycles, so young collections can be rare (measured: the collector had been
    # half the cost of a row).
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    pressure = CpuPressure.from_proc(time.monotonic) if worker.deferral else None
    Intake(worker, pressure=pressure.share if pressure else None,
           deferral=worker.deferral).run(channel, start.close_timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
