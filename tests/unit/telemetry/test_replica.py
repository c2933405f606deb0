"""Issue #30.5: replicas sharing one configuration file could not be told apart in rows
(`telemetry.replica` could only be set in the file)."""

from __future__ import annotations

import socket

from sidecar.telemetry.replica import REPLICA_ENV, replica_name


def test_the_environment_comes_before_the_file_and_the_host_name_last() -> None:
    assert replica_name("from-file", {REPLICA_ENV: "pod-7"}) == "pod-7"
    assert replica_name("from-file", {}) == "from-file"
    assert replica_name("", {REPLICA_ENV: "  "}) == socket.gethostname()
    assert replica_name("", {}) == socket.gethostname()
