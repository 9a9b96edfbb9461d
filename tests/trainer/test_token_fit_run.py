"""--seq-len longer than the dataset allows: the trainer's refusal names --seq-len (it blamed only
--batch-size and the ranks; issue 32)."""

from __future__ import annotations

import pytest

from dataio.storage.store import Store
from tests.dataio.tokengen import write_token_dataset
from tests.trainer.harness import run_here


@pytest.mark.slow  # the trainer in this process
@pytest.mark.timeout(120)
def test_a_seq_len_past_the_dataset_is_named(tmp_path, capsys) -> None:
    write_token_dataset(Store(str(tmp_path / "train")), [[30, 4, 61], [17, 90, 2]])
    got = run_here(["--model", "gpt", "--data", str(tmp_path / "train"), "--seq-len", "100000", "--n-layer", "1",
                    "--n-embd", "16", "--n-head", "2", "--batch-size", "4", "--out", str(tmp_path / "out"),
                    "--resume", "none"], capsys)
    assert got.returncode == 2, got.stderr[-2000:]
    assert "micro-steps sequences of --seq-len 100000 tokens" in got.stderr
    assert "use a smaller --seq-len, --batch-size or --grad-accum" in got.stderr
