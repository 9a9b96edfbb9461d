"""The autouse guard in tests/conftest.py fails tests that leave threads or processes behind."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import psutil

from tests import conftest

pytest_plugins = ["pytester"]


def test_guard_sees_a_new_thread_and_ignores_known_ones():
    threads_before, procs_before = set(threading.enumerate()), conftest._children()
    stop = threading.Event()
    leaked = threading.Thread(target=stop.wait, name="worker-leak", daemon=True)
    known = threading.Thread(target=stop.wait, name="fsspecIO", daemon=True)
    leaked.start()
    known.start()
    try:
        threads, procs = conftest._leaks(threads_before, procs_before)
        assert threads == [leaked] and procs == []
    finally:
        stop.set()
        leaked.join()
        known.join()
    assert conftest._leaks(threads_before, procs_before) == ([], [])


def test_guard_sees_a_child_process_and_kills_it():
    threads_before, procs_before = set(threading.enumerate()), conftest._children()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _, procs = conftest._leaks(threads_before, procs_before)
        assert [p.pid for p in procs] == [child.pid]
        conftest._kill(procs)  # reaps it too, so Popen.wait only confirms it is gone
        child.wait(timeout=10)
    finally:
        child.kill()
        child.wait()
    assert not any(p.pid == child.pid for p in conftest._children() if p.status() != psutil.STATUS_ZOMBIE)


def test_guard_fails_a_leaking_test_end_to_end(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n"
                          "from tests.conftest import pytest_configure  # noqa: F401\n")
    pytester.makepyfile(
        """
        import subprocess, sys

        def test_leaks_a_process():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*left threads or child processes running*"])
