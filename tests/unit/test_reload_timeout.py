"""A reload whose reading stalls (a file on a hung filesystem) is rejected after
`prepare_timeout_s`, and later reloads are refused, not stacked on stuck threads, until
the read ends (issue #28: no reload path may block)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from sidecar.operations import reload as reload_module
from sidecar.operations.reload import Reloader


def test_a_stalled_read_is_rejected_and_later_reloads_wait_for_it(tmp_path: Path,
                                                                 monkeypatch) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("models: {}\n")
    release = threading.Event()
    real_check = reload_module.check_config_file

    def stalled_check(where, *args, **kwargs):
        release.wait(timeout=60)
        return real_check(where, *args, **kwargs)

    monkeypatch.setattr(reload_module, "check_config_file", stalled_check)

    async def scenario() -> list:
        reloader = Reloader(path, sidecar=None, prepare_timeout_s=0.05)  # type: ignore[arg-type]
        first = await reloader.reload("test")
        second = await reloader.reload("test")
        release.set()
        assert reloader._reading is not None
        await reloader._reading  # the stalled read ends
        third = await reloader.reload("test")
        return [first, second, third]

    first, second, third = asyncio.run(scenario())
    assert not first.ok and "took longer than 0.05 s" in first.problems[0]
    assert not second.ok and "still reading the file" in second.problems[0]
    # The read ended: the next reload reads the file again and says what is wrong with it.
    assert not third.ok and "still reading" not in " ".join(third.problems)
    assert any("models" in problem for problem in third.problems), third.problems
