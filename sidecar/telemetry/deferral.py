"""When the telemetry worker should leave its input waiting: while the machine's CPUs are
contended, for a bounded time (docs/telemetry.md §3).

Why: `SCHED_IDLE` makes the worker give way only inside its own scheduling group, and the
request path's other processes (Envoy, in a session or container of its own) meet it as
the sidecar's group at normal weight. On saturated CPUs every microsecond of its work is
then taken from them (measured in §8). Leaving its input in the sidecar's hand-over buffer
while tasks queue for a CPU moves that work to after the burst, which is what `SCHED_IDLE`
was meant to give. The work is the same; only when it runs changes.

The signal is Linux's CPU pressure (`/proc/pressure/cpu`, "some"): the share of time in
which at least one runnable task waited for a CPU. Measured here on two cores: about 0.13
with one request at a time, 0.45 and more from four at a time. Where the file cannot be read
(no PSI in the kernel, a sandbox), the worker never defers.

Bounds: one deferral lasts at most `max_defer_s`; after one that ran out, the worker
defers again only once it has read everything waiting (caught up), so under sustained
pressure it works in stretches between deferrals and its input waits at most one deferral
plus the catch-up. Nothing here reads a clock or a file itself: both are injected, so
tests need no sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PSI_CPU = Path("/proc/pressure/cpu")


def psi_total_us(text: str) -> int:
    """The "some" line's cumulative stall time, in microseconds."""
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                name, _, value = field.partition("=")
                if name == "total":
                    return int(value)
    raise ValueError("no 'some ... total=' line")


class CpuPressure:
    """The share of wall time since the last call in which some task waited for a CPU."""

    def __init__(self, read_total_us: Callable[[], int], clock: Callable[[], float]) -> None:
        self._read = read_total_us
        self._clock = clock
        self._last = (clock(), read_total_us())

    @classmethod
    def from_proc(cls, clock: Callable[[], float]) -> CpuPressure | None:
        """None when this system does not report CPU pressure."""
        def read() -> int:
            return psi_total_us(PSI_CPU.read_text())
        try:
            read()
        except (OSError, ValueError):
            return None
        return cls(read, clock)

    def share(self) -> float:
        now, total = self._clock(), self._read()
        then, before = self._last
        self._last = (now, total)
        elapsed = now - then
        return (total - before) / (elapsed * 1e6) if elapsed > 0 else 0.0


@dataclass(frozen=True)
class DeferralPolicy:
    above: float = 0.3          # pressure share at which input is left waiting
    max_defer_s: float = 5.0    # the longest one deferral lasts
    check_s: float = 0.1        # how often pressure is read while deferring


class Deferral:
    """The worker asks `defer(now, pressure)` before reading; after `max_defer_s` of one
    deferral it must read until it reports `caught_up()`."""

    def __init__(self, policy: DeferralPolicy = DeferralPolicy()) -> None:
        self.policy = policy
        self._since: float | None = None   # when the current deferral began
        self._must_catch_up = False
        self.deferrals = 0                  # how many began

    def defer(self, now: float, pressure: float) -> bool:
        if self._must_catch_up or pressure < self.policy.above:
            self._since = None
            return False
        if self._since is None:
            self._since = now
            self.deferrals += 1
        if now - self._since >= self.policy.max_defer_s:
            self._since, self._must_catch_up = None, True
            return False
        return True

    def caught_up(self) -> None:
        self._must_catch_up = False
