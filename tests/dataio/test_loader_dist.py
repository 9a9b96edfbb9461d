"""The loader in real multi-process jobs: torchrun + gloo on CPU, and a real S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from dataio import make_loader
from dataio.storage.store import Store
from tests.dataio.shardgen import write_parquet_dataset, write_tar_dataset
from tools.process_tree import kill_tree

SCRIPT = os.path.join(os.path.dirname(__file__), "dist_loader.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = [17, 0, 4, 1, 29, 9]  # deliberately uneven
TOTAL = sum(SIZES)
BATCH_SIZE = 3  # as in dist_loader.py


def torchrun(nproc: int, mode: str, url: str, out_dir: str, *, also: tuple[tuple[str, str, str], ...] = (),
             timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run dist_loader.py on `nproc` local ranks (then `also`'s (mode, url, out_dir) in the same job); the
    whole process group dies on timeout."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--monitor_interval=0.2", SCRIPT, mode, url, out_dir, *(x for job in also for x in job)]
    env = os.environ | {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "TORCHELASTIC_ERROR_FILE": ""}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, cwd=ROOT)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # ranks run in sessions of their own
        out, _ = proc.communicate()
        pytest.fail(f"torchrun {mode} did not finish in {timeout_s} s (a rank hangs?):\n{out[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def read(out_dir: str, name: str) -> list[dict]:
    with open(os.path.join(out_dir, name)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("dist") / "ds")
    write_tar_dataset(Store(root), SIZES)
    return root


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_deliver_an_epoch_exactly_once_and_a_dataset_or_a_mixture_resume_on_three_ranks(
        dataset, tmp_path) -> None:
    """2 ranks of 2 workers: a whole epoch, then (a new loader, the same job) 2 batches and the state,
    then 2 batches of a tar + Parquet mixture and its state; 3 ranks of 1 worker resume both."""
    out, mix_out = str(tmp_path / "one"), str(tmp_path / "mix")
    for folder in (out, mix_out):
        os.makedirs(folder)
    tar, parquet = str(tmp_path / "tar"), str(tmp_path / "parquet")
    write_tar_dataset(Store(tar), [13, 0, 7, 1, 22, 5], real_images=True)  # 48 samples
    write_parquet_dataset(Store(parquet), [10, 6], real_images=True, seed=1)  # 16
    mixture = f"{tar}|{parquet}"  # weights 1:1 of 64: 32 each (the Parquet source twice over)
    first = torchrun(2, "epoch+stop", dataset, out, also=(("stop", mixture, mix_out),), timeout_s=240)
    assert first.returncode == 0, first.stdout[-3000:]
    ranks = read(out, "epoch.json")
    assert [r["world_size"] for r in ranks] == [2, 2]
    seen = [k for r in ranks for k in r["keys"]]
    assert len(seen) == len(set(seen))  # nothing twice
    assert TOTAL - len(seen) < 2 * BATCH_SIZE  # only a tail below one global batch is dropped
    steps = {r["steps"] for r in ranks}
    assert len(steps) == 1 and all(len(r["keys"]) == BATCH_SIZE * r["steps"] for r in ranks)

    second = torchrun(3, "resume", dataset, out, also=(("resume", mixture, mix_out),), timeout_s=240)
    assert second.returncode == 0, second.stdout[-3000:]
    before, after = read(out, "stop.json"), read(out, "resume.json")
    assert all(len(r["keys"]) == 2 * BATCH_SIZE for r in before)  # stopped after 2 batches each
    assert len({r["steps"] for r in after}) == 1  # equal steps on the new topology
    union = [k for r in before + after for k in r["keys"]]
    assert len(union) == len(set(union))  # nothing twice
    assert TOTAL - len(union) < 3 * BATCH_SIZE  # everything but a tail below one global batch

    before, after = read(mix_out, "stop.json"), read(mix_out, "resume.json")
    assert len({r["steps"] for r in after}) == 1  # equal steps on the new topology
    union = [k for r in before + after for k in r["keys"]]
    per_source = Counter(k.split(":")[0] for k in union)
    assert per_source["0"] == len({k for k in union if k.startswith("0:")}) <= 32  # tar: down-sampled, no repeat
    assert sum(per_source.values()) > 64 - 3 * 3  # only a tail below one global batch is dropped
    assert max(Counter(union).values()) <= 2  # the Parquet source's two passes, nothing more


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rank_without_the_dataset_fails_every_rank_fast(dataset, tmp_path) -> None:
    result = torchrun(2, "mismatch", dataset, str(tmp_path))
    assert result.returncode != 0
    errors = {r: read(str(tmp_path), f"error-{r}.json") for r in range(2)}
    assert errors[1]["type"] == "ManifestError" and "not-a-dataset" in errors[1]["message"]
    assert "rank 1 could not open the dataset" in errors[0]["message"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_reads_a_dataset_from_the_local_s3_server(s3_server) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    write_tar_dataset(Store(url, s3_server.options()), [7, 3, 11], real_images=True)
    with make_loader(url, batch_size=4, num_workers=1, image_size=8, tail="pad",
                     storage=s3_server.options()) as loader:
        batches = list(loader)
    keys = [k for b in batches for k, m in zip(b["__key__"], b["mask"].tolist()) if m]
    assert sorted(keys) == [f"{i:06d}" for i in range(21)]
    assert all(b["image"].shape == (4, 3, 8, 8) for b in batches)
