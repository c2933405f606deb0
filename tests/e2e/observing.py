"""Reading a running sidecar's observation windows from its admin port, for the end-to-end
stacks that assert what a target was charged with."""

from __future__ import annotations

import time

import httpx

from sidecar.devstack.harness import UpProcess


class Observing:
    """Mixed into a test stack that has `up` (a running `sidecar up`)."""

    up: UpProcess

    def admin(self, path: str) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.up.admin_http_port}{path}", timeout=5).json()

    def metric(self, name: str, **labels: str) -> float:
        """A sample of `/metrics` (Prometheus text), 0 when it is not there yet."""
        text = httpx.get(f"http://127.0.0.1:{self.up.admin_http_port}/metrics",
                         timeout=5).text
        wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample in (name, f"{name}{{{wanted}}}", f"{name}_total{{{wanted}}}"):
                return float(value)
        return 0.0

    def figures(self, target: str) -> dict:
        return self.admin("/observations")["targets"].get(target, {"count": 0, "outcomes": {}})

    def new_outcomes(self, target: str, before: dict, count: int,
                     timeout: float = 10.0) -> dict:
        """The target's outcomes since `before` (its figures then), once `count` more
        observations arrived."""
        deadline = time.monotonic() + timeout
        while True:
            figures = self.figures(target)
            if figures["count"] >= before["count"] + count:
                return {name: n - before["outcomes"].get(name, 0)
                        for name, n in figures["outcomes"].items()
                        if n != before["outcomes"].get(name, 0)}
            assert time.monotonic() < deadline, f"{target}: {figures}"
            time.sleep(0.05)
