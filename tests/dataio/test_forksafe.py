"""A fork waits for the library calls our threads have in progress (dataio.forksafe)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from dataio import forksafe

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _fork_and_reap() -> float:
    """Fork a child that leaves at once; the parent's time when fork() returned."""
    pid = os.fork()
    if pid == 0:
        with forksafe.busy():  # the child's guard is fresh: nothing in progress, no fork waiting
            pass
        os._exit(0)
    forked_at = time.monotonic()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return forked_at


def test_a_fork_waits_for_a_call_in_progress_in_another_thread() -> None:
    entered, left = threading.Event(), []

    def call() -> None:
        with forksafe.busy():
            entered.set()
            time.sleep(0.5)
            left.append(time.monotonic())

    thread = threading.Thread(target=call)
    thread.start()
    entered.wait(5)
    forked_at = _fork_and_reap()
    thread.join()
    assert left and forked_at >= left[0]  # the child never saw the call half done


def test_a_call_waits_while_a_fork_is_in_progress_and_runs_after() -> None:
    forksafe._before_fork()  # a fork begins (as os.fork's hook does)
    done = threading.Event()

    def call() -> None:
        with forksafe.busy():
            done.set()

    thread = threading.Thread(target=call)
    thread.start()
    assert not done.wait(0.2)  # held back: the fork has not finished
    forksafe._after_fork_in_parent()
    assert done.wait(5)
    thread.join()


class _CountingCondition(threading.Condition):
    """A Condition that counts its waits: whether a fork waited is seen, not timed."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.num_waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.num_waits += 1
        return super().wait(timeout)


def test_a_fork_from_inside_a_call_does_not_wait_for_itself(monkeypatch) -> None:
    cond = _CountingCondition()
    monkeypatch.setattr(forksafe._guard, "cond", cond)
    with forksafe.busy():
        _fork_and_reap()
    assert cond.num_waits == 0  # (waiting for itself, it would wait out FORK_WAIT_S, then fork)
