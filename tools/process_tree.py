"""Ending a launched job whole: torchrun starts each rank in a session of its own, so killing the
launcher's process group leaves the ranks (and their loader workers) running as orphans."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s descendants (found before anything dies: an orphan is no one's child) and its
    process group. Gone processes are skipped."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()
