"""Clients a forked child inherits from its parent: held, never closed there.

An s3fs client closes itself when collected (a weakref finalizer) by running its session's close on
the event loop that is running in the collecting thread. In a forked child that is the child's own
fsspec loop, while the client's connections belong to the parent's loop: aiohttp refuses ("attached
to a different loop") inside a task nobody awaits, printed at exit as "Task exception was never
retrieved" with its traceback (a `shardify write --resume` to S3 printed two, one per worker). A
child collects them because fsspec empties its instance cache at the fork and Stores reopen their
clients (Store.fs). So every client a Store opened is held here across a fork: the child keeps the
parent's clients alive, unused, until it exits (their sockets close with the process), and opens
its own. The parent keeps no extra reference (only a weak one).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

_OPENED: weakref.WeakSet[Any] = weakref.WeakSet()  # clients opened in this process (weakly)
_LOCK = threading.Lock()
_PASSING: list[Any] = []  # during a fork: this process's clients, for the child to hold
_HELD: list[Any] = []  # in a forked child: its parent's (and their parents') clients, held until exit


def keep_in_forked_children(client: Any) -> None:
    """Hold `client` (a filesystem a Store opened) in every child forked from now on."""
    with _LOCK:
        _OPENED.add(client)


def _before_fork() -> None:
    _LOCK.acquire()  # no Store adds a client mid-copy; released (or replaced) after the fork
    _PASSING.extend(_OPENED)


def _after_fork_in_parent() -> None:
    _PASSING.clear()  # the parent closes its own clients as usual
    _LOCK.release()


def _after_fork_in_child() -> None:
    global _OPENED, _LOCK
    _HELD.extend(_PASSING)
    _PASSING.clear()
    _OPENED, _LOCK = weakref.WeakSet(), threading.Lock()  # the child's own clients, from now on


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
