"""Process set-up of the long-running commands."""

from __future__ import annotations

import platform
import sys

import pytest

from sidecar.operations.process import keep_large_buffers_in_heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt tuning applies to glibc only")
def test_large_buffers_stay_in_the_heap_on_glibc() -> None:
    assert keep_large_buffers_in_heap() is True
