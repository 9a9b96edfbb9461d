"""`shardify which` / `python -m trainer.which` against `--record-keys` for every step of a real
torchrun run that resumed 2 ranks (grad_accum 1) -> 3 ranks (grad_accum 2) and ran a second epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from dataio.loader.which import run_which
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import REPO, env_for, ok, resumable_args, run_here, run_trainer

pytestmark = [pytest.mark.slow]


def _recorded(out: Path) -> dict[tuple[int, int], list[str]]:
    """(step, rank) -> the keys that rank trained on in that step."""
    got = {}
    for path in out.glob("keys-rank*.jsonl"):
        rank = int(path.stem.removeprefix("keys-rank"))
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            got[rec["step"], rank] = rec["keys"]
    return got


def _named(where: str, step: int) -> dict[tuple[int, int], list[str]]:
    rows = [json.loads(x) for x in run_which(Namespace(run=where, step=step, rank=None, export=None, json=True))]
    out: dict[tuple[int, int], list[str]] = {}
    for row in rows:
        if not row["pad"]:
            out.setdefault((step, row["rank"]), []).append(row["key"])
    return out


@pytest.mark.timeout(300)
def test_which_matches_the_recorded_keys_of_every_step_across_a_resume(tmp_path, five_steps_at_two_ranks):
    out = five_steps_at_two_ranks.copy_to(tmp_path / "out")  # 5 steps at 2 ranks of [60, 45, 75] real images
    args = resumable_args(five_steps_at_two_ranks.data, out, "--epochs", "2")
    ok(run_trainer([*args, "--grad-accum", "2", "--resume", "auto"], nproc=3, timeout_s=150))
    recorded = _recorded(out)
    steps = sorted({s for s, _ in recorded})
    assert steps == list(range(1, 18))  # 5 at 2 ranks, 5 more of epoch 0 and 7 of epoch 1 at 3 ranks
    named: dict[tuple[int, int], list[str]] = {}
    for step in steps:
        named.update(_named(str(out), step))
    assert named == recorded
    early = out / "checkpoints" / "ckpt-000000005.pt"  # pruned by --keep-checkpoints? then the newest only
    if early.exists():
        assert _named(str(early), 3) == {k: v for k, v in recorded.items() if k[0] == 3}
    export = tmp_path / "step7"
    cli = subprocess.run([sys.executable, "-m", "sharding.cli", "which", str(out), "--step", "7", "--rank", "2",
                          "--export", str(export)], cwd=REPO, env=env_for(), capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert sorted(p.stem for p in (export / "rank2").glob("*.jpg")) == sorted(
        k if i < 4 else f"m1-{k}" for i, k in enumerate(recorded[7, 2]))
    bad = subprocess.run([sys.executable, "-m", "trainer.which", str(out), "--step", "99"], cwd=REPO, env=env_for(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "step 99 is outside" in bad.stderr


@pytest.mark.timeout(300)
def test_a_scheduled_mixture_resumed_at_another_world_size_is_named_step_by_step(tmp_path, capsys):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    write_tar_dataset(Store(str(a)), [40, 32], real_images=True)
    write_tar_dataset(Store(str(b)), [24, 24], seed=3, real_images=True)
    args = ["--data", str(a), "--data", str(b), "--num-classes", "10", "--model", "tests.trainer.fakes:sleepy",
            "--batch-size", "4", "--image-size", "8", "--num-workers", "1", "--log-every", "2", "--out", str(out),
            "--record-keys", "--dist-timeout-s", "60", "--epochs", "1", "--mix-schedule", "0.8,0.2@48; 0.2,0.8"]
    ok(run_trainer([*args, "--max-steps", "3"], nproc=2, timeout_s=120))  # 24 samples into the 48 of piece 0
    ok(run_here([*args, "--resume", "auto"], capsys))  # 2 ranks -> 1, in the test's interpreter
    recorded = _recorded(out)
    named: dict[tuple[int, int], list[str]] = {}
    for step in sorted({s for s, _ in recorded}):
        named.update(_named(str(out), step))
    assert named == recorded and len(recorded) > 3 * 2 and {r for _, r in recorded} == {0, 1}
    summary = json.loads((out / "summary.json").read_text())
    assert [round(r["requested"], 2) for r in summary["sources"]] == [0.2, 0.8]  # the piece at the end
