"""Checkpoints with the loader state: a resume at another world size keeps every sample of the epoch
exactly once in the committed steps. (SIGKILL and SIGSTOP of a rank under torchrun --max-restarts, with
the same checks, are the fault suite's trainer group: tools/faults/training.py, tests/tools/test_faults.py.)"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.trainer.harness import SHARDS, committed_keys, ok, resumable_args, run_here

pytestmark = [pytest.mark.slow]


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
