"""`python -m tools.cloud_servers` stops its emulator and removes its folder on SIGINT (even started with
SIGINT ignored, as a shell starts a background job) and on SIGTERM (issue 32: both left them behind)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's start


@pytest.mark.slow  # starts fake-gcs-server through the CLI
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_emulator_and_removes_its_folder(signum: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tools.cloud_servers", "gcs"], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_ignore_sigint)
    try:
        line = proc.stdout.readline()
        found = re.search(r"\(process (\d+), files in (\S+)\)", line)
        assert found, line + proc.stderr.read() if proc.poll() is not None else line
        child, folder = psutil.Process(int(found.group(1))), Path(found.group(2))
        assert child.is_running() and folder.is_dir()
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
        psutil.wait_procs([child], timeout=10)
        assert not child.is_running() and not folder.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
