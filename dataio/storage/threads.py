"""Threads kept between requests: a process's pool that starts a thread only when none is idle.

Why: every S3 read into a window made a ThreadPoolExecutor for its parts and every hedged part one
more for its requests, so an epoch of 64 MB shards started and joined hundreds of threads (about
0.1 ms of CPU each here, beside the GIL they take). Here a finished task's thread waits for the
next one; none is ever queued behind a busy thread (a stalled request must not hold up another
part, and a hedge must start at once), so the pool has no size to deadlock on; an idle thread
ends after IDLE_S, so a process that stops reading keeps none.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

IDLE_S = 2.0  # an idle thread ends after this


class ElasticPool:
    """submit(fn) runs fn in an idle thread of the pool, or a new one; never queued."""

    def __init__(self, name: str, idle_s: float = IDLE_S) -> None:
        self.name, self.idle_s = name, idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []  # each idle thread's inbox, the latest idle last
        self._count = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        task = (future, fn, args)
        with self._lock:
            if self._idle:
                self._idle.pop().put(task)
                return future
            self._count += 1
            number = self._count
        threading.Thread(target=self._run, args=(task,), name=f"{self.name}_{number}", daemon=True).start()
        return future

    def _run(self, task: tuple[Future, Callable[..., Any], tuple]) -> None:
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        while True:
            future, fn, args = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - the submitter's to raise
                    future.set_exception(exc)
            del task, future, fn, args  # hold nothing of a finished task while idle
            with self._lock:
                self._idle.append(inbox)
            try:
                task = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody handed it a task in the meantime: end
                        self._idle.remove(inbox)
                        return
                task = inbox.get()  # handed one just as it timed out

    @property
    def num_idle(self) -> int:
        with self._lock:
            return len(self._idle)


_POOLS: dict[tuple[int, str], ElasticPool] = {}
_LOCK = threading.Lock()


def pool(name: str) -> ElasticPool:
    """This process's pool named `name` (a forked child gets its own: threads do not survive a fork)."""
    key = (os.getpid(), name)
    with _LOCK:
        found = _POOLS.get(key)
        if found is None:
            found = _POOLS[key] = ElasticPool(name)
        return found


def _in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a parent's thread may have held it at the fork
    _POOLS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
