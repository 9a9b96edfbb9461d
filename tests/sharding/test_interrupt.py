"""Interrupting `shardify write` (kill -9 or Ctrl-C) never leaves a manifest, a partial shard or a worker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest

from dataio.format.tar_index import build_index
from tests.sharding.conftest import ctrl_c_reaches_it, make_image_folder, manifest_of, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _start_write(src: Path, dest: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sharding.cli", "write", str(src), str(dest), "--workers", "2",
           "--max-samples-per-shard", "4", "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[2], preexec_fn=ctrl_c_reaches_it)


def _published(dest: Path) -> list[Path]:
    return sorted(p for p in (dest / "shards").glob("shard-*.tar")) if (dest / "shards").exists() else []


def _wait_for_shards(proc: subprocess.Popen, dest: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(_published(dest)) < n:
        assert proc.poll() is None, f"write ended before it could be interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _wait_gone(pids: list[int], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "worker processes outlived the interrupted write"
        time.sleep(0.1)


def _assert_no_partial_dataset(dest: Path) -> None:
    assert not (dest / "manifest.json").exists()
    for shard in _published(dest):  # every published shard is whole: it parses to the end, 4 samples
        with open(shard, "rb") as f:
            assert len(build_index(f)) == 4
        with tarfile.open(shard) as tar:
            assert len(tar.getmembers()) == 8
    assert not [p for p in (dest / "shards").iterdir() if ".tmp-" in p.name], "temporary files left behind"


@pytest.fixture
def big_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "images", per_class=300, size=96)


def test_kill_9_leaves_no_manifest_and_no_partial_shard(big_folder: Path, tmp_path: Path) -> None:
    dest = tmp_path / "ds"
    proc = _start_write(big_folder, dest)
    try:
        _wait_for_shards(proc, dest, 3)
        workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        _wait_gone(workers)  # orphans notice their parent is gone and stop
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    _assert_no_partial_dataset(dest)
    assert run("write", big_folder, dest, "--overwrite", "--quiet", "--max-samples-per-shard", 400) == 0


def _ctrl_c(src: Path, dest: Path, *, after_shards: int, delay_s: float = 0.0) -> tuple[int, bytes]:
    """Start a write, wait for `after_shards` shards (and `delay_s`), send SIGINT to the whole process
    group as a terminal does on Ctrl-C; (exit code, stderr) once it and its workers are gone."""
    proc = _start_write(src, dest)
    try:
        _wait_for_shards(proc, dest, after_shards)
        time.sleep(delay_s)
        workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        _wait_gone(workers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


def test_ctrl_c_leaves_no_manifest(big_folder: Path, tmp_path: Path) -> None:
    code, err = _ctrl_c(big_folder, tmp_path / "ds", after_shards=3)
    assert code == 130
    assert b"interrupted" in err and b"Traceback" not in err
    _assert_no_partial_dataset(tmp_path / "ds")


@pytest.mark.parametrize("delay_s", [0.0, 0.05, 0.2])
def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(big_folder: Path, tmp_path: Path, delay_s: float) -> None:
    # The moment matters: a worker may be closing a generator (a finalizer swallows exceptions) or
    # just forked; only the main process decides, and no "Exception ignored" traceback is printed.
    code, err = _ctrl_c(big_folder, tmp_path / "ds", after_shards=1, delay_s=delay_s)
    assert code == 130, err.decode()
    assert b"interrupted" in err and b"Traceback" not in err and b"Exception ignored" not in err, err.decode()
    _assert_no_partial_dataset(tmp_path / "ds")


def test_sigint_to_the_workers_alone_is_ignored(tmp_path: Path) -> None:
    # Workers leave only when the main process tells them (SIGTERM): a SIGINT that reaches a worker
    # and not the main process cannot break the pool or lose the write.
    src = make_image_folder(tmp_path / "images", per_class=40, size=96)
    dest = tmp_path / "ds"
    proc = _start_write(src, dest)
    try:
        _wait_for_shards(proc, dest, 1)
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err, err.decode()
    assert manifest_of(dest)["num_samples"] == len([p for p in src.rglob("*") if p.is_file()])
