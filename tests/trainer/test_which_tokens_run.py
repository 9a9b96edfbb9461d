"""`shardify which` on a real torchrun --model gpt run that resumed 2 ranks (grad_accum 1) -> 1 rank
(grad_accum 2, in the test's interpreter) and ran a second epoch: every step's sequences, named by document
and token range, hold the documents --record-keys saw in the delivered batches (their doc_ids). The 2 ranks'
run also shows a token run's reports and its validation (every held-out token once: test_gpt.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from argparse import Namespace

import numpy as np
import pytest

from dataio.format.manifest import read_manifest
from dataio.loader.which import run_which
from dataio.storage.store import Store
from tests.dataio.tokengen import write_token_dataset
from tests.trainer.harness import REPO, env_for, ok, run_here, run_trainer
from tests.trainer.test_gpt import VAL, reports_tokens_and_validates_every_token_once
from tests.trainer.test_which_run import _recorded

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(300)
def test_which_names_the_documents_of_every_step_of_a_resumed_gpt_run(tmp_path, capsys):
    data, out = tmp_path / "train", tmp_path / "out"
    rng = random.Random(7)
    write_token_dataset(Store(str(data)), [[rng.randint(1, 40) for _ in range(20)] for _ in range(3)])
    write_token_dataset(Store(str(tmp_path / "val")), VAL)
    args = ["--model", "gpt", "--data", str(data), "--val-data", str(tmp_path / "val"), "--seq-len", "16",
            "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--batch-size", "2", "--optimizer", "adamw",
            "--lr", "0.003", "--num-workers", "1", "--log-every", "2", "--peak-flops", "1e12", "--price-per-hour",
            "2", "--out", str(out), "--record-keys", "--dist-timeout-s", "60", "--epochs", "2", "--no-live"]
    two_ranks = ok(run_trainer([*args, "--max-steps", "3"], nproc=2, timeout_s=120))
    reports_tokens_and_validates_every_token_once(two_ranks.stdout, out)
    ok(run_here([*args, "--grad-accum", "2", "--resume", "auto"], capsys))
    recorded = _recorded(out)
    steps = sorted({s for s, _ in recorded})
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 8
    assert {r for _, r in recorded} == {0, 1}  # steps 1-3 at 2 ranks
    doc_base = np.concatenate([[0], np.cumsum(read_manifest(Store(str(data))).shard_num_samples)])
    shard_of = {p: j for j, p in enumerate(read_manifest(Store(str(data))).shard_paths)}
    named: dict[tuple[int, int], list[str]] = {}
    for step in steps:
        for row in map(json.loads, run_which(Namespace(run=str(out), step=step, rank=None, export=None, json=True))):
            if not row["pad"]:
                docs = [f"d{doc_base[shard_of[r['shard']]] + r['document']}" for r in row["ranges"]]
                named.setdefault((step, row["rank"]), []).append("+".join(docs))
    assert named == recorded
    cli = subprocess.run([sys.executable, "-m", "sharding.cli", "which", str(out), "--step", "5", "--rank", "0"],
                         cwd=REPO, env=env_for(), capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "rank 0 micro 1 row 1: 17 tokens" in cli.stdout and " document " in cli.stdout
