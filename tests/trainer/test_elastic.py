"""Checkpoints with the loader state: SIGKILL of a rank under torchrun --max-restarts, and a resume at
another world size, both keep every sample of the epoch exactly once in the committed steps."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.trainer.harness import SHARDS, committed_keys, finish, ok, resumable_args, run_here, start
from tools.faults import rank_pid

pytestmark = [pytest.mark.slow]

FAKE = {"FAKE_COMPUTE_S": "0.08"}  # a known minimum step time, so a kill lands mid-epoch (~1 s of margin)


@pytest.fixture(scope="module")
def dataset(resumable_dataset: str) -> str:
    return resumable_dataset  # SHARDS real images (tests/trainer/conftest.py)


def _args(data: str, out: Path, *extra: str) -> list[str]:
    return resumable_args(data, out, *extra)


def _assert_exactly_once(out: Path, *, max_global_batch: int) -> dict[int, list[str]]:
    steps = committed_keys(out)
    assert sorted(steps) == list(range(1, max(steps) + 1)), "a committed step is missing or doubled"
    seen = Counter(k for keys in steps.values() for k in keys)
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1][:5]
    everything = {f"{i:06d}" for i in range(sum(SHARDS))}
    assert set(seen) <= everything
    assert len(everything - set(seen)) < max_global_batch  # only the documented dropped tail
    return steps


def _notes(out: Path) -> list[str]:
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["text"] for r in records if r["kind"] == "note"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.timeout(180)
def test_sigkill_of_a_rank_restarts_the_group_and_resumes_exactly_once(tmp_path, dataset):
    out = tmp_path / "out"
    proc = start(_args(dataset, out, "--checkpoint-every", "3", "--epochs", "1"), nproc=2, env=FAKE,
                 max_restarts=1)
    killed = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if _lines(out / "keys-rank1.jsonl") >= 8 and list((out / "checkpoints").glob("ckpt-*.pt")):
            killed = rank_pid(proc.pid, 1)
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.02)
    assert killed is not None, "never saw rank 1 mid-epoch"
    result = ok(finish(proc, timeout_s=150))
    assert any("saved by 2 ranks, now 2" in n for n in _notes(out)), result.stdout[-2000:]
    steps = _assert_exactly_once(out, max_global_batch=8)
    assert max(steps) == sum(SHARDS) // 8  # the run finished the epoch after the restart


@pytest.mark.timeout(180)
def test_resume_on_another_world_size_continues_the_epoch(tmp_path, five_steps_at_two_ranks, capsys):
    dataset = five_steps_at_two_ranks.data
    out = five_steps_at_two_ranks.copy_to(tmp_path / "out")  # 5 steps at 2 ranks (--max-steps 5 --epochs 1)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [  # with its loader-state sidecar
        "ckpt-000000005.loader-state.json", "ckpt-000000005.pt"]
    ok(run_here(_args(dataset, out, "--epochs", "1", "--resume", "auto"), capsys))  # one process, in this one
    assert any("step 5, epoch 0 (saved by 2 ranks, now 1)" in n for n in _notes(out))
    steps = _assert_exactly_once(out, max_global_batch=8)
    assert all(len(steps[s]) == 8 for s in range(1, 6)) and all(len(steps[s]) == 4 for s in steps if s > 5)
