"""A clock the test moves by hand: what every clock-injected part takes instead of
`time.monotonic` or `time.time`, so no test sleeps."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
