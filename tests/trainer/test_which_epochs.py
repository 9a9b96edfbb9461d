"""The run's history survives a resume from an epoch-end checkpoint (whose loader position is not
loaded): `which` still names the steps of the first epoch, as --record-keys recorded them."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from dataio.loader.which import run_which
from dataio.storage.store import Store
from tests.trainer.test_tabular import FEATURES, write_table_dataset
from trainer.__main__ import main


@pytest.mark.slow  # two trainings in this process, ~10-25 s
def test_which_names_steps_before_an_epoch_end_resume(tmp_path):
    url, out = str(tmp_path / "train"), tmp_path / "out"
    write_table_dataset(Store(url), [40, 30, 26], seed=0)  # 96 rows: 6 steps of 16 per epoch
    args = ["--data", url, "--model", "mlp", "--features", ",".join(FEATURES), "--batch-size", "8",
            "--grad-accum", "2", "--num-workers", "0", "--out", str(out), "--no-live", "--record-keys"]
    assert main([*args, "--epochs", "1"]) == 0
    assert main([*args, "--epochs", "2", "--resume", "auto"]) == 0
    lines = (out / "keys-rank0.jsonl").read_text().splitlines()
    recorded = {json.loads(x)["step"]: json.loads(x)["keys"] for x in lines}
    assert sorted(recorded) == list(range(1, 13))
    for step, keys in recorded.items():
        rows = [json.loads(x) for x in run_which(Namespace(run=str(out), step=step, rank=None, export=None, json=True))]
        assert [r["key"] for r in rows] == keys, step
