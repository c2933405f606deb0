"""The `running` fixture: a real gRPC server on loopback for one test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.grpcwire.servers import Running


@pytest.fixture()
def running() -> Iterator[Running]:
    server = Running()
    yield server
    server.close()
