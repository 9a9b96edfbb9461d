"""--skip-steps past a planted bad batch: a learnable table trained to a low loss at 2 ranks, one step
of epoch 2 with labels scrambled by the test (placed by the plan) is named in spikes.jsonl (its keys,
its worst samples, the worst spike of the run, in the summary; this run is also the spike test); resumed
from a checkpoint before it at 1 rank (in the test's interpreter) with --skip-steps, the run never sees
those samples and delivers every other sample of the epoch exactly once (checked with --record-keys)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dataio.loader.make import make_loader
from dataio.plan.which import batch_ids
from dataio.storage.store import Store
from tests.trainer.harness import ok, run_here, run_trainer, summary
from tests.trainer.test_spikes import _write_scrambled
from tests.trainer.test_tabular import FEATURES, write_table_dataset

SIZES, B, WORLD = [400, 300, 500], 16, 2
STEPS_PER_EPOCH = sum(SIZES) // (B * WORLD)  # 37
PLANTED = 10  # epoch 2's 11th step: run step 2 * 37 + 11 = 85
STEP = 2 * STEPS_PER_EPOCH + PLANTED + 1
pytestmark = [pytest.mark.slow]


def _planted_ids(url: str) -> list[int]:
    """Both ranks' ids of epoch 2's batch PLANTED at 2 ranks (num_workers 0 plans one worker)."""
    with make_loader(url, batch_size=B, num_workers=0, decode=None, fields=(*FEATURES, "cls"), rank=0,
                     world_size=1) as loader:
        config = loader.plan_config
    return [i for r in range(WORLD) for i in batch_ids(np.asarray(SIZES), config=config, epoch=2, before=(),
                                                       world_size=WORLD, num_workers=1, rank=r,
                                                       batch=PLANTED).ids.tolist()]


def _keys(out: Path, first: int, last: int) -> list[str]:
    """Every rank's recorded keys of steps first..last."""
    keys = []
    for path in out.glob("keys-rank*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if first <= rec["step"] <= last:
                keys += rec["keys"]
    return keys


@pytest.mark.timeout(420)
def test_skip_steps_past_a_planted_bad_batch_at_another_world_size(tmp_path, capsys):
    url = str(tmp_path / "train")
    write_table_dataset(Store(url), SIZES, seed=0)
    planted = {f"0-{i:06d}" for i in _planted_ids(url)}
    _write_scrambled(url, set(_planted_ids(url)))
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["--data", url, "--model", "mlp", "--features", ",".join(FEATURES), "--batch-size", str(B),
            "--optimizer", "adamw", "--lr", "0.01", "--epochs", "3", "--num-workers", "0", "--no-live",
            "--log-every", "20", "--record-keys", "--dist-timeout-s", "60"]
    ok(run_trainer([*args, "--out", str(first), "--checkpoint-every", "10", "--keep-checkpoints", "20",
                    "--spike-sample-losses"], nproc=WORLD, timeout_s=200))
    _assert_the_planted_step_is_the_worst_spike(first, planted)
    resume_at = STEP // 10 * 10  # 80: the newest checkpoint before the spike, in epoch 2
    ckpt = first / "checkpoints" / f"ckpt-{resume_at:09d}.pt"
    result = ok(run_here([*args, "--out", str(second), "--resume", str(ckpt), "--skip-steps", f"{STEP}:{STEP}"],
                         capsys))  # 2 ranks -> 1
    later = _keys(second, resume_at + 1, 10**6)
    assert not planted & set(later)
    epoch2 = _keys(first, 2 * STEPS_PER_EPOCH + 1, resume_at) + later
    assert len(epoch2) == len(set(epoch2))  # exactly once
    left = set(f"0-{i:06d}" for i in range(sum(SIZES))) - planted - set(epoch2)
    assert len(left) < B  # only the tail below one global batch of the 1 rank
    skipped = summary(second)["skipped"]
    assert skipped[0]["steps"] == f"{STEP}:{STEP}" and skipped[0]["step_samples"] == len(planted)
    assert f"skipped: steps {STEP}:{STEP}" in result.stdout
    events = [json.loads(x) for x in (second / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("kind") == "skip" and e["steps"] == f"{STEP}:{STEP}" for e in events)


def _assert_the_planted_step_is_the_worst_spike(out: Path, planted: set[str]) -> None:
    """spikes.jsonl names the planted step on both ranks with exactly its keys and, per rank, its worst
    samples among them; it is the run's worst spike, and the summary lists it."""
    rows = [json.loads(x) for x in (out / "spikes.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["step"] == STEP)
    assert row["ranks"] == list(range(WORLD))  # the planted batch spans both ranks' micro-batches
    assert sorted(k for keys in row["keys"].values() for k in keys) == sorted(planted)
    assert set(row["worst"]) == set(row["keys"]) == {str(r) for r in range(WORLD)}
    for rank, worst in row["worst"].items():
        assert worst and {w["key"] for w in worst} <= set(row["keys"][rank])
    assert max(rows, key=lambda r: max(r["loss"].values()))["step"] == STEP  # the worst spike of the run
    assert STEP in [r["step"] for r in summary(out)["spikes"]]


@pytest.mark.timeout(120)
def test_skip_samples_by_key_from_the_first_step(tmp_path):
    # 290 rows (SIZES' shape, a quarter the size): 8 skipped keys take each epoch from 9 steps of 32 to 8
    url, sizes = str(tmp_path / "train"), [100, 75, 115]
    write_table_dataset(Store(url), sizes, seed=0)
    bad = [f"0-{i:06d}" for i in range(0, sum(sizes), 37)]
    (tmp_path / "bad.txt").write_text("# found by hand\n" + "\n".join(bad) + "\n")
    out = tmp_path / "out"
    from trainer.__main__ import main

    assert main(["--data", url, "--model", "mlp", "--features", ",".join(FEATURES), "--batch-size", "32",
                 "--epochs", "2", "--num-workers", "0", "--no-live", "--out", str(out), "--record-keys",
                 "--skip-samples", str(tmp_path / "bad.txt")]) == 0
    seen = _keys(out, 1, 10**6)
    assert not set(bad) & set(seen)
    # each epoch shrinks by the skipped samples
    assert len(seen) == 2 * ((sum(sizes) - len(bad)) // 32 * 32) == 2 * 8 * 32
    assert summary(out)["skipped"][0]["file_samples"] == len(bad)
