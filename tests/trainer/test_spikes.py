"""The running median's rule on its own, and how a test plants a bad batch (labels scrambled in
place). The planted batch named in spikes.jsonl (its keys, its worst samples, the worst spike of the
run) is checked on the 2-rank torchrun run of tests/trainer/test_skip_steps.py, which trains once for
both: spikes and --skip-steps past them."""

from __future__ import annotations

from dataio.storage.store import Store
from trainer.spikes import MIN_STEPS, SpikeWatch, merge

SIZES = [400, 300, 500]  # the table tests/trainer/test_skip_steps.py writes and plants a bad batch in


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
