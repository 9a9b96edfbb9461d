"""Forks wait for our threads' library calls: a child must not inherit a lock held mid-call.

A loader forks its worker processes while this process may have threads of its own at work (another
loader's first-batch read, reader threads). A library call in such a thread (pyarrow decoding a
row group) can hold an internal lock at the moment of the fork; the child inherits it held, and
its first call into that library waits forever (seen: a trainer's validation loader hung at its
first batch, its worker stuck in pyarrow's read_row_groups, forked while the training loader's
first batch was being read in a thread). So such calls run inside `busy()`, and every fork
(os.register_at_fork) first waits for the calls in progress to end and holds new ones back
until the fork is done. The calls are short (one window's parse); the wait is bounded anyway.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

FORK_WAIT_S = 30.0  # a call longer than this is not waited for (a stuck library: fork anyway)


class _Guard:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.busy = 0  # calls in progress
        self.forking = 0  # forks in progress (new calls wait)
        self.owner: dict[int, int] = {}  # thread id -> its calls in progress (a fork from inside one must not wait for itself)


_guard = _Guard()


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Run a library call that no fork may interrupt; nests."""
    g, me = _guard, threading.get_ident()
    with g.cond:
        while g.forking and not g.owner.get(me):
            g.cond.wait()
        g.busy += 1
        g.owner[me] = g.owner.get(me, 0) + 1
    try:
        yield
    finally:
        with g.cond:
            g.busy -= 1
            g.owner[me] -= 1
            if not g.owner[me]:
                del g.owner[me]
            g.cond.notify_all()


def _before_fork() -> None:
    g, me = _guard, threading.get_ident()
    deadline = time.monotonic() + FORK_WAIT_S
    with g.cond:
        g.forking += 1
        while g.busy - g.owner.get(me, 0) > 0 and time.monotonic() < deadline:
            g.cond.wait(timeout=max(0.0, deadline - time.monotonic()))


def _after_fork_in_parent() -> None:
    g = _guard
    with g.cond:
        g.forking -= 1
        g.cond.notify_all()


def _after_fork_in_child() -> None:
    global _guard
    _guard = _Guard()  # the child has only the forking thread: nothing is in progress there


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
