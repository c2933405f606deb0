"""How the telemetry worker reads the sidecar's messages (intake.py), in process with a
real store: while the CPUs are contended it leaves them waiting, for a bounded time, and it
reads only what its writer has room for, so catching up loses nothing that fits. The
pressure and the clock are injected; the writer is the real, paced one."""

from __future__ import annotations

import marshal
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sidecar.config.service_settings import Telemetry
from sidecar.telemetry.deferral import Deferral, DeferralPolicy
from sidecar.telemetry.intake import HURRY_AFTER_S, ITEMS_PER_MESSAGE, Intake
from sidecar.telemetry.results import result_record
from sidecar.telemetry.rows import decision_record
from sidecar.telemetry.worker import Start, Worker
from tests.unit.telemetry.test_handoff import decision, result

POLICY = DeferralPolicy(above=0.3, max_defer_s=5.0, check_s=0.01)


def messages(first: int, requests: int) -> list[bytes]:
    """The sidecar's messages for `requests` decided and finished requests."""
    items = []
    for n in range(first, first + requests):
        items.append(marshal.dumps(("d", decision_record(decision(f"r{n}")))))
        items.append(marshal.dumps(("r", result_record(result(f"r{n}")))))
    return [marshal.dumps(items[i:i + ITEMS_PER_MESSAGE])
            for i in range(0, len(items), ITEMS_PER_MESSAGE)]


class Machine:
    """The pressure and the clock the worker sees; both move only when the test says."""

    def __init__(self, pressure: float = 0.0) -> None:
        self.pressure = pressure
        self.now = 1000.0

    def later(self, seconds: float, pressure: float | None = None) -> None:
        if pressure is not None:
            self.pressure = pressure
        self.now += seconds


@contextmanager
def reading(tmp_path: Path, machine: Machine, deferral: Deferral | None,
            queue_size: int = 10_000) -> Iterator[tuple[socket.socket, Worker]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    worker = Worker(Start(Telemetry(sqlite_path=tmp_path / "t.db", queue_size=queue_size),
                          60.0, {}, "WARNING", "text"))
    intake = Intake(worker, pressure=lambda: machine.pressure,
                    deferral=deferral, clock=lambda: machine.now,
                    sleep=lambda _s: time.sleep(0.001))
    thread = threading.Thread(target=intake.run, args=(theirs, 5.0), daemon=True)
    thread.start()
    ours.recv(1 << 20)  # the first report: the store is open
    try:
        yield ours, worker
    finally:
        machine.later(60.0, pressure=0.0)  # a deferring worker notices the end on reading
        ours.close()
        thread.join(30)
        assert not thread.is_alive()


def rows(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "t.db") as db:
        return db.execute("SELECT count(*) FROM request_rows").fetchone()[0]


def until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def sent_while_contended(channel: socket.socket, worker: Worker, machine: Machine) -> None:
    """300 requests sent while the worker defers: none taken in 0.3 s of real time (the
    worker's clock stands still)."""
    machine.later(0.1)
    for message in messages(0, 300):
        channel.send(message)
    time.sleep(0.3)
    assert len(worker.joiner) == 0 and worker.writer.written == 0


def test_input_waits_while_the_cpus_are_contended_and_is_read_once_they_are_free(
        tmp_path: Path) -> None:
    machine = Machine(pressure=0.9)
    deferral = Deferral(POLICY)
    with reading(tmp_path, machine, deferral) as (channel, worker):
        sent_while_contended(channel, worker, machine)
        machine.later(0.1, pressure=0.1)
        until(lambda: worker.writer.written == 300)
    assert rows(tmp_path) == 300 and deferral.deferrals == 1


def test_a_deferral_ends_after_its_limit_and_starts_again_only_once_caught_up(
        tmp_path: Path) -> None:
    machine = Machine(pressure=0.9)
    deferral = Deferral(POLICY)
    with reading(tmp_path, machine, deferral) as (channel, worker):
        sent_while_contended(channel, worker, machine)
        machine.later(POLICY.max_defer_s)  # still contended: the limit is reached
        until(lambda: worker.writer.written == 300)
        machine.later(0.1)                 # caught up and contended: a new deferral
        until(lambda: deferral.deferrals == 2)
        for message in messages(300, 100):
            channel.send(message)
        time.sleep(0.3)
        assert worker.writer.written == 300
    assert rows(tmp_path) == 400 and deferral.deferrals == 2


def test_without_a_pressure_signal_input_is_read_at_once(tmp_path: Path) -> None:
    machine = Machine(pressure=0.9)
    with reading(tmp_path, machine, None) as (channel, worker):
        for message in messages(0, 100):
            channel.send(message)
        until(lambda: worker.writer.written == 100)


def test_what_the_writer_has_no_room_for_waits_in_the_socket_not_dropped(
        tmp_path: Path) -> None:
    """A queue of 100 rows, and 600 requests arriving at once: the reader takes a message
    only when the writer has room for it, so every row is written and none dropped."""
    machine = Machine()
    with reading(tmp_path, machine, None, queue_size=100) as (channel, worker):
        for message in messages(0, 600):
            channel.send(message)
        until(lambda: worker.writer.written == 600)
        assert worker.writer.dropped == {"queue_full": 0, "write_error": 0}
        assert worker.writer.depth <= 100


def test_a_worker_behind_for_long_hurries_until_it_has_caught_up(tmp_path: Path) -> None:
    """Behind (a message always waiting) for HURRY_AFTER_S of its clock: its paced pace is
    not enough, so the writer hurries; finding nothing waiting calms it again."""
    machine = Machine()
    with reading(tmp_path, machine, None, queue_size=100) as (channel, worker):
        for message in messages(0, 600):
            channel.send(message)
        until(lambda: worker.writer.written > 0)
        assert not worker.writer.hurry
        machine.later(HURRY_AFTER_S)
        until(lambda: worker.writer.hurry)
        until(lambda: worker.writer.written == 600)
        until(lambda: not worker.writer.hurry)
