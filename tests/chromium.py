"""Headless Chromium from Debian's package (`.ci/services` installs it), for tests that check
what an HTML page the project writes shows when a browser renders it. Everything stays on
the machine: the page is a local file, and the background-networking switches keep
Chromium from reaching out."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage")


def chromium() -> str:
    """The browser, or a loud skip where it is not installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium: install Debian's chromium package (.ci/services does) to "
                "check rendered HTML", allow_module_level=False)
    raise AssertionError  # unreachable


def _run(page: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    """`page`: a local file, or an http://127.0.0.1 address (the console's pages)."""
    address = page.as_uri() if isinstance(page, Path) else page
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium(), *_FLAGS, f"--user-data-dir={profile}", *args, address],
            capture_output=True, text=True, timeout=120, check=True)


def rendered_dom(page: Path | str) -> str:
    """The document as Chromium built it from the file (after parsing and layout)."""
    return _run(page, "--dump-dom").stdout


def screenshot(page: Path | str, out: Path, width: int = 800, height: int = 1600,
               dark: bool = False) -> Path:
    """`dark`: with the system's dark preference (`prefers-color-scheme: dark`)."""
    _run(page, f"--screenshot={out}", f"--window-size={width},{height}",
         "--hide-scrollbars", *(("--force-dark-mode",) if dark else ()))
    return out
