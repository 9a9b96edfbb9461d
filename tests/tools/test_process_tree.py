"""kill_tree ends a launched job whole, ranks in sessions of their own included (torchrun's way)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tools.process_tree import kill_tree

pytestmark = pytest.mark.slow

# A launcher whose child starts a new session, as torchrun starts each rank: prints the child's pid, waits.
LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_child_in_its_own_session_dies_with_its_launcher() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = psutil.Process(int(proc.stdout.readline()))
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    kill_tree(proc.pid)
    proc.wait(timeout=10)
    child.wait(timeout=10)  # psutil.TimeoutExpired if it survived (an orphan, as the killpg alone left it)
    assert not child.is_running()


def test_a_gone_process_is_no_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    time.sleep(0.1)
    kill_tree(proc.pid)
