"""The autouse guard in tests/conftest.py fails tests that leave threads or processes behind."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

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


@pytest.mark.slow  # starts a program
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


@pytest.mark.slow  # runs pytest in a new interpreter
def test_guards_fail_a_leaking_test_and_an_unmarked_server_test_end_to_end(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n"
                          "from tests.conftest import pytest_configure  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    slow: starts programs\n")
    pytester.makepyfile(
        """
        import subprocess, sys

        import pytest

        @pytest.mark.slow
        def test_leaks_a_process():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

        @pytest.mark.slow
        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_starts_a_program_unmarked():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_in_process():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=2)  # an error at teardown follows its test's pass
    result.stdout.fnmatch_lines(["*left threads or child processes running*"])
    result.stdout.fnmatch_lines(["*test_starts_a_program_unmarked*", "*not marked slow started a subprocess*"])
    result.stdout.no_fnmatch_line("*test_clean - *")
