"""A torchrun run that several trainer tests resume in their own way, started once per session: once in
all, where pytest-xdist spreads those tests over several worker processes (a lock and a shared folder)."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import SHARDS, FiveSteps, ok, resumable_args, run_trainer


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder of this test session, built by `build` once: the first worker process to ask builds it
    while the others wait on a lock, then all read it (the tests copy what they change)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own (popen-gwN)
    where = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (where / ".built").exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir(parents=True)
            build(where)
            (where / ".built").touch()
    return where


@pytest.fixture(scope="session")
def resumable_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SHARDS real images as a tar dataset, written once (read-only for the tests)."""
    root = built_once(tmp_path_factory, "resumable", lambda at: write_tar_dataset(Store(str(at / "train")), SHARDS,
                                                                                  real_images=True))
    return str(root / "train")


@pytest.fixture(scope="session")
def five_steps_at_two_ranks(resumable_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> FiveSteps:
    """One torchrun run that test_elastic (resumed at 1 rank) and test_which_run (at 3 ranks, grad_accum 2,
    into a second epoch) both start from: each resumes a copy, so neither sees the other's steps."""
    def run(at: Path) -> None:
        ok(run_trainer(resumable_args(resumable_dataset, at / "out", "--max-steps", "5", "--epochs", "1"), nproc=2,
                       timeout_s=120))

    return FiveSteps(resumable_dataset, built_once(tmp_path_factory, "five_steps", run) / "out")
