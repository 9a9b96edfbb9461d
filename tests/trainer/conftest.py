"""A torchrun run that several trainer tests resume in their own way, started once per session."""

from __future__ import annotations

import pytest

from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import SHARDS, FiveSteps, ok, resumable_args, run_trainer


@pytest.fixture(scope="session")
def resumable_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SHARDS real images as a tar dataset, written once (read-only for the tests)."""
    data = tmp_path_factory.mktemp("resumable") / "train"
    write_tar_dataset(Store(str(data)), SHARDS, real_images=True)
    return str(data)


@pytest.fixture(scope="session")
def five_steps_at_two_ranks(resumable_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> FiveSteps:
    """One torchrun run that test_elastic (resumed at 1 rank) and test_which_run (at 3 ranks, grad_accum 2,
    into a second epoch) both start from: each resumes a copy, so neither sees the other's steps."""
    out = tmp_path_factory.mktemp("five_steps") / "out"
    ok(run_trainer(resumable_args(resumable_dataset, out, "--max-steps", "5", "--epochs", "1"), nproc=2,
                   timeout_s=120))
    return FiveSteps(resumable_dataset, out)
