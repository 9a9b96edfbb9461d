"""The trainer on a real, messy image folder: every format and colour mode, written by `shardify write`
as tar and as Parquet, trained in one process (the loader decodes each sample's own image; two ranks on tar
shards: test_end_to_end.py)."""

from __future__ import annotations

import pytest

from sharding.cli import main as shardify
from tests.dataio.mixed_images import write_mixed_folder
from tests.trainer.harness import ok, run_here, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_trainer_on_a_mixed_folder(tmp_path, fmt, capsys):
    expected = write_mixed_folder(tmp_path / "images", copies=2)
    assert shardify(["write", str(tmp_path / "images"), str(tmp_path / "ds"), "--format", fmt, "--workers", "1",
                     "--quiet", "--max-samples-per-shard", "8"]) == 0
    out = tmp_path / "out"
    ok(run_here(["--data", str(tmp_path / "ds"), "--val-data", str(tmp_path / "ds"), "--batch-size", "4",
                 "--epochs", "1", "--image-size", "16", "--num-workers", "1", "--out", str(out),
                 "--resume", "none", "--log-every", "2"], capsys))
    rep = summary(out)
    assert rep["world_size"] == 1 and rep["validation"]["samples"] == len(expected)
