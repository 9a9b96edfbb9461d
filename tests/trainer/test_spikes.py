"""A planted bad batch is named: a learnable table trained to a low loss, then one batch of epoch 2
whose labels the test scrambled (placed by the plan) shows up in spikes.jsonl with its keys and
its worst samples; the running median's rule on its own."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dataio.loader.make import make_loader
from dataio.plan.which import batch_ids
from dataio.storage.store import Store
from tests.trainer.test_tabular import FEATURES, write_table_dataset
from trainer.__main__ import main
from trainer.spikes import MIN_STEPS, SpikeWatch, merge

SIZES, B, STEPS_PER_EPOCH, PLANTED = [400, 300, 500], 32, 1200 // 32, 10  # epoch 2's 11th step


def _planted_ids(url: str) -> list[int]:
    """The global ids of epoch 2's batch PLANTED, as the trainer's one-rank loader delivers them."""
    with make_loader(url, batch_size=B, num_workers=0, decode=None, fields=(*FEATURES, "cls"), rank=0,
                     world_size=1) as loader:
        config = loader.plan_config
    got = batch_ids(np.asarray(SIZES), config=config, epoch=2, before=(), world_size=1, num_workers=1, rank=0,
                    batch=PLANTED)
    return got.ids.tolist()


@pytest.mark.slow  # ~35 s of training in this process
@pytest.mark.timeout(180)
def test_a_planted_bad_batch_is_named_in_spikes_jsonl(tmp_path):
    url = str(tmp_path / "train")
    write_table_dataset(Store(url), SIZES, seed=0)
    planted = set(_planted_ids(url))
    _write_scrambled(url, planted)
    out = tmp_path / "out"
    assert main(["--data", url, "--model", "mlp", "--features", ",".join(FEATURES), "--batch-size", str(B),
                 "--optimizer", "adamw", "--lr", "0.01", "--epochs", "3", "--num-workers", "0", "--out", str(out),
                 "--no-live", "--log-every", "20", "--spike-sample-losses"]) == 0
    rows = [json.loads(x) for x in (out / "spikes.jsonl").read_text().splitlines()]
    step = 2 * STEPS_PER_EPOCH + PLANTED + 1
    row = next(r for r in rows if r["step"] == step)
    assert row["ranks"] == [0]
    assert sorted(row["keys"]["0"]) == sorted(f"0-{i:06d}" for i in planted)
    assert {w["key"] for w in row["worst"]["0"]} <= set(row["keys"]["0"])
    assert max(rows, key=lambda r: r["loss"]["0"])["step"] == step  # the worst spike of the run
    summary = json.loads((out / "summary.json").read_text())
    assert step in [r["step"] for r in summary["spikes"]]


def _write_scrambled(url: str, planted: set[int]) -> None:
    """Rewrite the dataset with the planted ids' labels moved to the next class (same sizes: same plan)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    store = Store(url)
    first = 0
    for i, n in enumerate(SIZES):
        rel = f"shards/shard-{i:06d}.parquet"
        table = pq.read_table(io.BytesIO(store.read(rel)))
        cls = table.column("cls").to_numpy().copy()
        for j in range(n):
            if first + j in planted:
                cls[j] = (cls[j] + 1) % 3
        table = table.set_column(table.column_names.index("cls"), "cls", pa.array(cls))
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=16)
        store.write_bytes(rel, buf.getvalue())
        first += n
    _rewrite_manifest(store)


def _rewrite_manifest(store: Store) -> None:
    import dataclasses
    import io

    import pyarrow.parquet as pq

    from dataio.format.manifest import checksum_bytes, read_manifest, write_manifest

    m = read_manifest(store)
    datas = [store.read(p) for p in m.shard_paths]
    groups = tuple(tuple(pq.ParquetFile(io.BytesIO(d)).metadata.row_group(g).num_rows
                         for g in range(pq.ParquetFile(io.BytesIO(d)).metadata.num_row_groups)) for d in datas)
    write_manifest(store, dataclasses.replace(m, shard_num_bytes=tuple(len(d) for d in datas),
                                              shard_checksums=tuple(checksum_bytes(d) for d in datas),
                                              row_groups=groups))


def test_the_running_median_rule():
    watch = SpikeWatch(3.0)
    assert all(watch.observe(s, 1.0, rank=0) is None for s in range(1, MIN_STEPS + 1))
    assert watch.observe(MIN_STEPS + 1, 2.9, rank=0) is None
    spike = watch.observe(MIN_STEPS + 2, 3.5, rank=1, keys=["a", "b"], sample_losses=[0.1, 9.0])
    assert spike == {"step": MIN_STEPS + 2, "rank": 1, "loss": 3.5, "median": 1.0,
                     "worst": [{"key": "b", "loss": 9.0}, {"key": "a", "loss": 0.1}]}
    assert SpikeWatch(0).observe(99, 1e9, rank=0) is None  # 0: off
    assert merge([[spike], [{**spike, "rank": 0}]])[0]["ranks"] == [0, 1]
