"""Graceful stop on SIGINT/SIGTERM for the long-running commands."""

from __future__ import annotations

import asyncio
import signal


async def until_stop_signal() -> None:
    """Return once SIGINT (Ctrl-C) or SIGTERM arrives."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
