"""Hidden temporary files of atomic local publishes (`.name.tmp-PID-XXXX` beside the target), and
the ones this process has open right now.

A publish writes the temporary file, renames it over the target and removes it if anything went
wrong: the `finally` of the block that owns it. A process that must stop at once (a `shardify write`
worker leaving with os._exit on an interrupt) can be stopped where no block will run its `finally`:
between a context manager's generator yielding the file and the `with` that will close it. Such a
process calls `remove_open()` first, so no temporary file outlives it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator

_OPEN: set[str] = set()  # temporary paths of this process whose block has not ended
_LOCK = threading.Lock()


def _forget_parents() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a fork may copy it held
    _OPEN.clear()  # the parent's files: its blocks end them, never this child


os.register_at_fork(after_in_child=_forget_parents)


@contextlib.contextmanager
def temporary_beside(path: str) -> Iterator[str]:
    """A hidden temporary path in `path`'s directory, removed when the block ends (whatever renamed
    it over `path` before then leaves nothing to remove)."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with _LOCK:
        _OPEN.add(tmp)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        with _LOCK:
            _OPEN.discard(tmp)


def remove_open() -> list[str]:
    """Remove every temporary file this process has open (what os._exit would leave); the paths removed."""
    with _LOCK:
        paths = sorted(_OPEN)
        _OPEN.clear()
    removed = []
    for tmp in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
            removed.append(tmp)
    return removed
