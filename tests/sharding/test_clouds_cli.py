"""A folder written to gs:// and az:// (and s3://) with `shardify`, checked, collected, then trained on with
torchrun, the checkpoints stored there too, and resumed from them; the credentials from a storage config file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataio.format.manifest import read_manifest
from tests.clouds import Cloud
from tests.sharding.conftest import run
from tests.trainer.harness import ok, run_here

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _config(cloud: Cloud, tmp_path: Path) -> str:
    path = tmp_path / "storage.toml"
    path.write_text(cloud.config_toml())
    return str(path)


def test_write_append_inspect_verify_index_gc(cloud: Cloud, image_folder: Path, tmp_path: Path, capsys) -> None:
    url, conf = cloud.new_url("ds"), _config(cloud, tmp_path)
    assert run("write", image_folder, url, "--max-samples-per-shard", 10, "--workers", 1, "--quiet",
               "--storage-config", conf) == 0
    assert run("append", image_folder, url, "--max-samples-per-shard", 10, "--quiet", "--storage-config", conf) == 0
    store = cloud.store(url)
    assert read_manifest(store).num_samples == 48
    for command in (("inspect", url), ("verify", url, "--quiet"), ("gc", url, "--grace", "0s")):
        assert run(*command, "--storage-config", conf) == 0, command
    parquet = cloud.new_url("export")  # shardify index: existing Parquet files made a dataset in place
    table = pa.table({"image": [b"\x00" * 10, b"\x01" * 10], "label": [0, 1]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    cloud.store(parquet).write_bytes("train-0.parquet", sink.getvalue().to_pybytes())
    assert run("index", parquet, "--storage-config", conf) == 0
    assert read_manifest(cloud.store(parquet)).num_samples == 2
    out = capsys.readouterr()
    for secret in cloud.secrets:
        if len(secret) >= 8:
            assert secret not in out.out + out.err


def test_trains_and_resumes_from_a_checkpoint_stored_there(cloud: Cloud, image_folder: Path, tmp_path: Path,
                                                           capsys) -> None:
    if cloud.kind == "s3":
        pytest.skip("S3 has its own (tests/trainer/test_secrets.py)")
    url, conf = cloud.new_url("ds"), _config(cloud, tmp_path)
    assert run("write", image_folder, url, "--max-samples-per-shard", 6, "--quiet", "--storage-config", conf) == 0
    ckpt = url.rsplit("/", 1)[0] + "/ckpt"
    common = ["--data", url, "--checkpoint-dir", ckpt, "--storage-config", conf, "--num-classes", "3",
              "--model", "mlp", "--batch-size", "4", "--image-size", "8", "--num-workers", "0",
              "--out", str(tmp_path / "run"), "--no-live", "--dist-timeout-s", "60", "--checkpoint-every", "2"]
    # One process each, in this one: ranks reading and checkpointing to object storage under torchrun are
    # test_secrets.py's (S3); a rank's storage is the same code for every cloud.
    ok(run_here(common, capsys))
    assert any(name.startswith("ckpt-") for name in cloud.store(ckpt).list())
    second = ok(run_here([*common, "--epochs", "2"], capsys))
    assert f"resumed from {ckpt}/ckpt-" in second.stdout, second.stdout[-3000:]
