"""The pool of threads kept between S3 reads (dataio/storage/threads.py): reused, never queued, ended idle."""

from __future__ import annotations

import threading
import time

import pytest

from dataio.storage.threads import ElasticPool


def _ident() -> int:
    return threading.get_ident()


def test_a_finished_task_s_thread_runs_the_next():
    pool = ElasticPool("test-elastic", idle_s=0.5)
    first = pool.submit(_ident).result(timeout=5)
    time.sleep(0.05)  # the thread is back among the idle ones
    assert pool.num_idle == 1
    assert pool.submit(_ident).result(timeout=5) == first


def test_a_busy_thread_never_holds_up_another_task():
    pool = ElasticPool("test-elastic", idle_s=0.5)
    release = threading.Event()
    blocked = pool.submit(release.wait, 10)
    try:
        assert pool.submit(lambda: 7).result(timeout=5) == 7  # not queued behind the blocked one
    finally:
        release.set()
    assert blocked.result(timeout=5) is True


def test_an_idle_thread_ends():
    pool = ElasticPool("test-elastic-idle", idle_s=0.1)
    pool.submit(_ident).result(timeout=5)
    deadline = time.monotonic() + 5
    while any(t.name.startswith("test-elastic-idle") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name.startswith("test-elastic-idle") for t in threading.enumerate())
    assert pool.num_idle == 0
    assert pool.submit(lambda: 3).result(timeout=5) == 3  # a new thread for the next task


def test_errors_reach_the_submitter():
    pool = ElasticPool("test-elastic", idle_s=0.5)

    def fail() -> None:
        raise OSError("reset")

    with pytest.raises(OSError, match="reset"):
        pool.submit(fail).result(timeout=5)
    assert pool.submit(lambda: 1).result(timeout=5) == 1  # the thread survived its task's error
