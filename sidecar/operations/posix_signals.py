"""Graceful stop on SIGINT/SIGTERM for the long-running commands; SIGHUP reloads the
configuration (operations/reload.py) and never stops the process."""

from __future__ import annotations

import asyncio
import logging
import signal


async def until_stop_signal() -> None:
    """Return once SIGINT (Ctrl-C) or SIGTERM arrives."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


def ignore_sighup(why: str) -> None:
    """Where there is nothing to reload, SIGHUP says so instead of ending the process."""
    logger = logging.getLogger("sidecar.reload")
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGHUP, lambda: logger.warning("SIGHUP ignored: %s", why))
