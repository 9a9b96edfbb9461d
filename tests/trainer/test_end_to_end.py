"""The whole path on real shards: torchrun, 2 gloo ranks, the real loader, validation, every output file."""

from __future__ import annotations

import json

import pytest

from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.trainer.harness import ok, run_trainer, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def test_two_ranks_on_tar_shards_with_validation(tmp_path):
    write_tar_dataset(Store(str(tmp_path / "train")), [40, 25, 35], real_images=True)
    write_tar_dataset(Store(str(tmp_path / "val")), [13, 10], seed=1, real_images=True)
    out = tmp_path / "out"
    result = ok(run_trainer([
        "--data", str(tmp_path / "train"), "--val-data", str(tmp_path / "val"), "--num-classes", "10",
        "--batch-size", "4", "--grad-accum", "2", "--optimizer", "adamw", "--lr", "0.003", "--epochs", "2",
        "--image-size", "16", "--num-workers", "1", "--log-every", "3", "--out", str(out), "--resume", "none",
        "--checkpoint-every", "4"]))
    assert "verdict: " in result.stdout and "overlap summary" in result.stdout
    rep = summary(out)
    assert rep["world_size"] == 2 and rep["verdict"].split(":")[0] in ("INPUT-BOUND", "COMPUTE-BOUND")
    assert rep["validation"]["samples"] == 23  # padded tail masked: every validation sample once
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds.count("validation") == 2 and kinds[-1] == "summary"
    # 100 samples / (2 ranks x 4 x 2 micro-steps) = 6 steps per epoch, the tail dropped.
    assert max(r["step"] for r in records if r["kind"] == "checkpoint") == 12
    trace = json.loads((out / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}
    assert (out / "steps.png").read_bytes()[:4] == b"\x89PNG"
