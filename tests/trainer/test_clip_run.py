"""`--model clip` run as users run it: torchrun with 2 gloo ranks on a pair dataset, validated
zero-shot on labelled images; resumed on 1 rank (in the test's interpreter); `shardify which` names every
step's pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.harness import ok, run_here, run_trainer, summary
from tests.trainer.test_which_run import _named, _recorded
from tools.demo_pairs import prepare, train_args

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(420)
def test_clip_trains_on_two_ranks_resumes_on_one_and_which_names_its_pairs(tmp_path: Path, capsys) -> None:
    prepare(tmp_path, 96)
    args = [*train_args(tmp_path, epochs=1, batch_size=8), "--record-keys", "--log-every", "2", "--no-live",
            "--dist-timeout-s", "60"]
    ok(run_trainer([*args, "--max-steps", "2"], nproc=2, timeout_s=180))
    first = summary(tmp_path / "run")
    assert set(first["validation"]) >= {"accuracy", "chance", "loss", "samples"}
    result = ok(run_here([*args, "--resume", "auto"], capsys))
    assert "resumed from" in result.stdout + result.stderr
    val = summary(tmp_path / "run")["validation"]
    assert val["samples"] == 270 and val["chance"] == pytest.approx(1 / 9) and 0 <= val["accuracy"] <= 1
    recorded = _recorded(tmp_path / "run")
    steps = sorted({s for s, _ in recorded})
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 4  # 96 pairs: 2 steps of 16, then of 8
    named = {}
    for step in steps:
        named.update(_named(str(tmp_path / "run"), step))
    assert named == recorded
    keys = [k for ks in recorded.values() for k in ks]
    assert len(keys) == len(set(keys))  # each pair at most once in the epoch, across the resume


def test_clip_without_a_tokenizer_is_refused_in_one_sentence(tmp_path: Path, capsys) -> None:
    prepare(tmp_path, 12)
    args = train_args(tmp_path, epochs=1, batch_size=4)
    at = args.index("--tokenizer")
    result = run_here([*args[:at], *args[at + 2:]], capsys)
    assert result.returncode != 0 and "give tokenizer=" in result.stdout + result.stderr
