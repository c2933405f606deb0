"""The folder a `sidecar up` keeps its Envoy files in, and the removal of those a dead
stack left behind (a killed process runs no clean-up).

Each folder records the pid of the stack that made it; at start-up, folders whose stack is
gone are removed. Only this user's folders are touched (mkdtemp makes them 0700)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "sidecar-up-"
PID_FILE = "pid"


def new_workdir() -> Path:
    """Private to this user (mkdtemp: 0700): the bootstrap carries the channel token."""
    workdir = Path(tempfile.mkdtemp(prefix=PREFIX))
    (workdir / PID_FILE).write_text(f"{os.getpid()}\n")
    return workdir


def remove_stale_workdirs(root: Path | None = None) -> list[Path]:
    """Remove the folders of stacks that are no longer running; returns them."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    for folder in root.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            if folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / PID_FILE).read_text())
            if pid == os.getpid() or _alive(pid):
                continue
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has that pid now
        return True
    return True
