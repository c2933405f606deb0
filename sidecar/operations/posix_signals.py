"""Graceful stop on SIGINT/SIGTERM for the long-running commands; SIGHUP reloads the
configuration (operations/reload.py) and never stops the process."""

from __future__ import annotations

import asyncio
import logging
import signal


async def until_stop_signal() -> signal.Signals:
    """Return the signal once SIGINT (Ctrl-C: stop now) or SIGTERM (drain, then stop:
    operations/drain.py) arrives."""
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[signal.Signals] = loop.create_future()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(
            signum, lambda s=signum: arrived.done() or arrived.set_result(s))
    return await arrived


def ignore_sighup(why: str) -> None:
    """Where there is nothing to reload, SIGHUP says so instead of ending the process."""
    logger = logging.getLogger("sidecar.reload")
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGHUP, lambda: logger.warning("SIGHUP ignored: %s", why))
