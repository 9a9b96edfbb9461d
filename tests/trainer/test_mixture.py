"""The trainer on a weighted mixture of datasets: --data URL=WEIGHT, per-source samples/s and shares."""

from __future__ import annotations

import json

import pytest

from dataio.storage.store import Store
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset
from trainer import runtime
from trainer.flags import parse_config
from trainer.train import setup, train, wrap


@pytest.mark.timeout(180)
def test_trainer_reports_observed_vs_requested_shares_of_a_mixture(tmp_path, capsys):
    tar, parquet = str(tmp_path / "web"), str(tmp_path / "gold")
    write_tar_dataset(Store(tar), [40, 24, 32], real_images=True)
    write_parquet_dataset(Store(parquet), [8, 8], real_images=True, seed=1)
    cfg = parse_config(["--data", f"{tar}=0.75", "--data", f"{parquet}=0.25", "--model", "mlp",
                        "--num-classes", "10", "--image-size", "8", "--no-augment", "--batch-size", "8",
                        "--num-workers", "0", "--epochs", "1", "--log-every", "2", "--out", str(tmp_path / "run"),
                        "--resume", "none", "--no-live", "--device", "cpu"])
    rt = runtime.start(device="cpu", timeout_s=30, env={})
    run = setup(cfg, rt)
    wrap(run)
    train(run)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    intervals = [x for x in lines if x["kind"] == "train"]
    assert intervals and all(len(x["sources"]) == 2 for x in intervals)
    summary = next(x for x in lines if x["kind"] == "summary")
    web, gold = summary["sources"]
    assert (web["requested"], gold["requested"]) == (0.75, 0.25)
    assert web["source"].endswith("web")
    # Over the run (whole shuffle windows) the shares are exact; an interval of 2 steps samples the
    # shuffled window, so its share only fluctuates around the requested one.
    assert (web["samples"], gold["samples"]) == (84, 28) and web["observed"] == 0.75
    assert sum(s["samples"] for x in intervals for s in x["sources"]) == 112
    out = capsys.readouterr().out
    assert "mixture: observed vs requested" in out and "mix observed/requested" in out
