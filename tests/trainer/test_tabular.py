"""The MLP on table rows from Parquet shards: numeric columns in, labels from `cls`, through the real loader."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataio.format.manifest import Field, Manifest, checksum_bytes, write_manifest
from dataio.storage.store import Store
from trainer.__main__ import main

FEATURES = ("f0", "f1", "f2", "f3")


def write_table_dataset(store: Store, shard_sizes: list[int], *, seed: int) -> None:
    """Parquet shards of 4 float columns; cls = which of f0..f2 is largest (learnable, 3 classes)."""
    rng = np.random.default_rng(seed)
    paths, sizes, sums, groups, first = [], [], [], [], 0
    for i, n in enumerate(shard_sizes):
        x = rng.normal(size=(n, 4))
        columns = {"__key__": pa.array([f"{seed}-{first + j:06d}" for j in range(n)])}
        columns.update({name: pa.array(x[:, k]) for k, name in enumerate(FEATURES)})
        columns["cls"] = pa.array(x[:, :3].argmax(1).astype(np.int64))
        buf = io.BytesIO()
        pq.write_table(pa.table(columns), buf, row_group_size=16)
        data, first = buf.getvalue(), first + n
        rel = f"shards/shard-{i:06d}.parquet"
        store.write_bytes(rel, data)
        md = pq.ParquetFile(io.BytesIO(data)).metadata
        paths.append(rel), sizes.append(len(data)), sums.append(checksum_bytes(data))
        groups.append(tuple(md.row_group(g).num_rows for g in range(md.num_row_groups)))
    write_manifest(store, Manifest(
        format="parquet", fields=(*(Field(name=f, type="float") for f in FEATURES), Field(name="cls", type="int")),
        shard_paths=tuple(paths), shard_num_samples=tuple(shard_sizes), shard_num_bytes=tuple(sizes),
        shard_checksums=tuple(sums), row_groups=tuple(groups), source="tests.trainer", label_names=("0", "1", "2"),
    ))


@pytest.mark.slow  # trains for seconds
@pytest.mark.timeout(240)
def test_mlp_learns_table_rows_from_parquet(tmp_path):
    write_table_dataset(Store(str(tmp_path / "train")), [400, 300, 500], seed=0)
    write_table_dataset(Store(str(tmp_path / "val")), [150, 100], seed=1)
    out = tmp_path / "out"
    assert main(["--data", str(tmp_path / "train"), "--val-data", str(tmp_path / "val"), "--model", "mlp",
                 "--features", ",".join(FEATURES), "--batch-size", "32", "--optimizer", "adamw", "--lr", "0.01",
                 "--epochs", "3", "--num-workers", "0", "--out", str(out), "--no-live", "--log-every", "20"]) == 0
    val = json.loads((out / "summary.json").read_text())["validation"]
    assert val["samples"] == 250 and val["accuracy"] > 0.85, val


def test_resnet_refuses_table_rows(tmp_path, capsys):
    write_table_dataset(Store(str(tmp_path / "train")), [64], seed=0)
    assert main(["--data", str(tmp_path / "train"), "--features", "f0,f1", "--model", "resnet",
                 "--out", str(tmp_path / "o"), "--num-workers", "0", "--batch-size", "8"]) == 2
    assert "use --model mlp" in capsys.readouterr().err
