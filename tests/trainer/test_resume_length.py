"""Issue 19 item 4: a resume with a larger --epochs or --max-steps replans the cosine for the new
total from the samples already seen, logs the change of lr (stderr and metrics.jsonl), and never
trains the added steps at lr 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.__main__ import main
from trainer.schedule import WarmupCosine, planned_samples

pytestmark = [pytest.mark.timeout(120)]

BASE = ["--data", "synthetic:?samples=64&classes=4", "--model", "tests.trainer.fakes:sleepy", "--batch-size", "8",
        "--image-size", "4", "--num-workers", "0", "--log-every", "1", "--no-live", "--lr", "0.1"]


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_planned_samples_and_replan():
    assert planned_samples(epochs=2, epoch_samples=64, max_steps=0, step=0, samples_seen=0, global_batch=8) == 128
    assert planned_samples(epochs=2, epoch_samples=64, max_steps=5, step=0, samples_seen=0, global_batch=8) == 40
    # max-steps counted on from where the run is, at this start's global batch (another world size)
    assert planned_samples(epochs=9, epoch_samples=64, max_steps=8, step=4, samples_seen=32, global_batch=16) == 96
    sched = WarmupCosine(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), base_lr=0.1,
                         total_samples=64, warmup_samples=0, min_ratio=0.0)
    sched.step(64)
    assert sched.lr == 0.0
    before, after = sched.replan(128)
    assert (before, after) == (0.0, pytest.approx(0.05)) and sched.optimizer.param_groups[0]["lr"] == after


def test_a_larger_epochs_on_resume_extends_the_cosine_and_logs_the_lr(tmp_path, capsys):
    out = tmp_path / "o"
    assert main([*BASE, "--out", str(out), "--epochs", "1"]) == 0
    assert _records(out, "train")[-1]["lr"] == 0.0  # the first run's cosine ended
    capsys.readouterr()
    assert main([*BASE, "--out", str(out), "--epochs", "2"]) == 0
    err = capsys.readouterr().err
    assert "--epochs 1 -> 2" in err and "lr at the resume 0.000e+00 -> 5.000e-02" in err, err
    added = [r for r in _records(out, "train") if r["epoch"] == 1]
    assert len(added) == 8 and all(r["lr"] > 0 for r in added[:-1]), added  # before: lr 0 all epoch
    (change,) = _records(out, "schedule")
    assert (change["old_lr"], change["new_lr"]) == (0.0, pytest.approx(0.05))
    assert (change["old_total_samples"], change["new_total_samples"], change["samples_seen"]) == (64, 128, 64)
    capsys.readouterr()
    assert main([*BASE, "--out", str(out), "--epochs", "2"]) == 0  # same lengths: the saved plan stands
    assert len(_records(out, "schedule")) == 1


def test_a_larger_max_steps_on_resume_trains_the_added_steps_above_lr_0(tmp_path, capsys):
    out = tmp_path / "o"
    assert main([*BASE, "--out", str(out), "--epochs", "3", "--max-steps", "4"]) == 0
    capsys.readouterr()
    assert main([*BASE, "--out", str(out), "--epochs", "3", "--max-steps", "8"]) == 0
    assert "--max-steps 4 -> 8" in capsys.readouterr().err
    added = [r for r in _records(out, "train") if r["step"] > 4]
    assert [r["step"] for r in added] == [5, 6, 7, 8]
    assert all(r["lr"] > 0 for r in added[:-1]), added
