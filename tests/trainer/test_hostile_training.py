"""Issue 9, the trainer's read side: a truncated newest checkpoint is skipped by --resume auto,
a label outside --num-classes names its shard and key. (A stopped rank named within --dist-timeout-s
is tests/trainer/test_lost_rank.py's 2-rank run, which also times the job's exit.)"""

from __future__ import annotations

import pytest

from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from trainer.__main__ import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SYNTH = "synthetic:?samples=64&classes=4"


def test_resume_auto_skips_a_truncated_newest_checkpoint(tmp_path, capsys):
    out = tmp_path / "o"
    base = ["--data", SYNTH, "--model", "tests.trainer.fakes:sleepy", "--batch-size", "8", "--image-size", "4",
            "--checkpoint-every", "1", "--keep-checkpoints", "3", "--out", str(out), "--no-live"]
    assert main([*base, "--max-steps", "2"]) == 0
    ckpts = sorted((out / "checkpoints").glob("ckpt-*.pt"))
    assert [p.name for p in ckpts][-1] == "ckpt-000000002.pt"
    newest = ckpts[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a torn write
    capsys.readouterr()
    assert main([*base, "--max-steps", "3"]) == 0
    said = capsys.readouterr()
    text = said.out + said.err + (out / "metrics.jsonl").read_text()
    assert "skipped checkpoint ckpt-000000002.pt" in text, text[-3000:]
    assert "resumed from" in text and "ckpt-000000001.pt: step 1" in text


def test_label_outside_num_classes_names_the_shard_and_key(tmp_path, capsys):
    data = tmp_path / "ds"
    write_tar_dataset(Store(str(data)), [12, 12], real_images=True)  # labels 0..9
    capsys.readouterr()
    code = main(["--data", str(data), "--num-classes", "5", "--model", "tests.trainer.fakes:sleepy",
                 "--batch-size", "4", "--image-size", "8", "--num-workers", "0", "--out", str(tmp_path / "o"),
                 "--no-live", "--max-steps", "4"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    line = next(x for x in err.splitlines() if x.startswith("trainer: error:"))
    assert "outside the model's 5 classes" in line and "shard-00000" in line and "sample '0000" in line
    assert "IndexError" not in err
