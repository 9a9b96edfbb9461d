"""Parquet segment reads: row groups overlapping the range only, column projection, clear errors."""

from __future__ import annotations

import dataclasses
import pickle
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataio import ShardFormatError, StorageError
from dataio.format.manifest import read_manifest
from dataio.readers.by_format import make_reader
from dataio.readers.parquet import ParquetReader, column_values
from dataio.storage.store import Store
from tests.dataio.shardgen import FAST_RETRY, Seg, write_parquet_dataset

pytestmark = pytest.mark.timeout(120)

class CountingStore(Store):
    """A real local Store that records the byte ranges it is asked for."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.ranges: list[tuple[str, int | None, int | None]] = []

    def read(self, rel, start=None, end=None, *, expect_size=None):  # noqa: ANN001, ANN201
        self.ranges.append((rel, start, end))
        return super().read(rel, start, end, expect_size=expect_size)


def read(reader, seg):
    return reader.parse(seg, reader.fetch(seg))


@pytest.fixture
def local(tmp_path):
    store = CountingStore(str(tmp_path / "ds"), retry=FAST_RETRY)
    manifest, samples = write_parquet_dataset(store, [10, 0, 1, 23], row_group_size=4)
    return store, manifest, samples


@pytest.mark.parametrize("seg", [
    pytest.param(Seg(0, 0, 10), id="whole"),
    pytest.param(Seg(3, 3, 13), id="across-groups"),
    pytest.param(Seg(3, 4, 8), id="exactly-one-group"),
    pytest.param(Seg(3, 7, 9), id="straddles-boundary"),
    pytest.param(Seg(3, 22, 23), id="last"),
    pytest.param(Seg(3, 5, 5), id="empty"),
    pytest.param(Seg(1, 0, 0), id="empty-shard"),
    pytest.param(Seg(2, 0, 1), id="one-row-shard"),
])
def test_segment_equals_pyarrow_rows(local, seg):
    store, manifest, samples = local
    got = read(make_reader(store, manifest), seg)
    assert got == samples[seg.shard][seg.start : seg.stop]
    table = pq.read_table(store.path(manifest.shard_paths[seg.shard]))
    assert [{k: v for k, v in s.items() if k not in ("__id__", "__url__")} for s in got] == table.to_pylist()[seg.start : seg.stop]


def test_only_overlapping_row_groups_and_projected_columns_are_read(local):
    store, manifest, samples = local
    reader = make_reader(store, manifest, fields=["cls"])
    reader.metadata(3)
    store.ranges.clear()
    seg = Seg(3, 7, 9)  # rows 7 and 8: row groups 1 and 2 of 4 rows each
    payload = reader.fetch(seg)
    assert payload.groups == (1, 2)
    md = pq.ParquetFile(store.path(manifest.shard_paths[3])).metadata
    needed = sum(md.row_group(g).column(i).total_compressed_size for g in (1, 2) for i in range(4)
                 if md.row_group(g).column(i).path_in_schema in ("__key__", "cls"))
    fetched = sum(end - start for _, start, end in store.ranges)
    assert needed <= fetched == reader.payload_bytes(seg) < md.row_group(1).total_byte_size * 2
    got = reader.parse(seg, payload)
    assert got == [{"__key__": s["__key__"], "__id__": s["__id__"], "__url__": s["__url__"], "cls": s["cls"]} for s in samples[3][7:9]]


def test_footer_is_read_once_per_shard(local):
    store, manifest, samples = local
    reader = make_reader(store, manifest)
    for start in range(0, 23, 5):
        assert read(reader, Seg(3, start, min(23, start + 5))) == samples[3][start : start + 5]
    tails = [r for r in store.ranges if r[2] == manifest.shard_num_bytes[3]]
    assert len(tails) == 1


def test_footers_are_cached_within_a_byte_budget(local, monkeypatch):
    import dataio.readers.parquet as parquet_module

    store, manifest, samples = local
    monkeypatch.setattr(parquet_module, "METADATA_CACHE_BYTES", 1)  # every footer over the budget: one kept
    reader = make_reader(store, manifest)
    for shard in (0, 3, 0):
        assert read(reader, Seg(shard, 0, 2)) == samples[shard][0:2]
    assert len(reader._footers) == 1
    tails = [r for r in store.ranges if r[2] == manifest.shard_num_bytes[0]]
    assert len(tails) == 2  # shard 0's footer was let go for shard 3's, and read again


def test_reader_pickles_for_worker_processes(local):
    store, manifest, samples = local
    reader = make_reader(store, manifest)
    read(reader, Seg(3, 0, 2))
    clone = pickle.loads(pickle.dumps(reader))
    assert isinstance(clone, ParquetReader)
    assert read(clone, Seg(0, 2, 6)) == samples[0][2:6]


def test_row_groups_unlike_the_manifest_are_refused(local):
    store, manifest, _ = local
    groups = list(manifest.row_groups)
    groups[3] = (5, 5, 5, 5, 3)  # the file has 4, 4, 4, 4, 4, 3
    stale = dataclasses.replace(manifest, row_groups=tuple(groups))
    with pytest.raises(ShardFormatError, match=r"shard-000003\.parquet: row groups \[4, 4, 4, 4, 4, 3\] do not match"):
        make_reader(store, stale).fetch(Seg(3, 0, 1))


def test_not_parquet_is_a_clear_error(local):
    store, manifest, _ = local
    size = manifest.shard_num_bytes[0]
    store.write_bytes(manifest.shard_paths[0], b"x" * size)
    with pytest.raises(ShardFormatError, match=r"shard-000000\.parquet: not a Parquet file"):
        make_reader(store, manifest).fetch(Seg(0, 0, 1))


def test_truncated_shard_is_refused_when_first_opened(local):
    """Each shard's size is checked against the manifest when first read: no retries over a cut file."""
    store, manifest, _ = local
    data = store.read(manifest.shard_paths[0])
    store.write_bytes(manifest.shard_paths[0], data[:-100])
    with pytest.raises(ShardFormatError, match=rf"shard-000000\.parquet: shard is {len(data) - 100} bytes but "
                                               rf"the manifest says {len(data)}"):
        make_reader(store, manifest).fetch(Seg(0, 0, 1))


def test_truncated_shard_after_opening_fails_at_once(local):
    store, manifest, _ = local
    reader = make_reader(store, manifest)
    reader.metadata(0)
    data = store.read(manifest.shard_paths[0])
    store.write_bytes(manifest.shard_paths[0], data[:-30000])
    with pytest.raises(StorageError, match=r"shard-000000\.parquet bytes .*TruncatedFileError.*the file is shorter"):
        reader.fetch(Seg(0, 0, manifest.shard_num_samples[0]))  # a local file: no retries


def test_column_values_fast_paths_match_to_pylist():
    arrays = [
        pa.array([b"a", b"", b"xyz"], pa.binary()), pa.array([b"a", b"bc"], pa.large_binary()),
        pa.array(["k1", "k\u00e9"], pa.string()), pa.array([1, 2, 3], pa.int64()),
        pa.array([0.5, 1.5]), pa.array([True, False]), pa.array([b"a", None], pa.binary()),
        pa.array([[1], [2, 3]]),
    ]
    for array in arrays:
        chunked = pa.chunked_array([array, array.slice(1)])
        assert column_values(chunked) == chunked.to_pylist()


def test_reads_from_memory_url():
    store = Store(f"memory://pq-{uuid.uuid4().hex[:8]}")
    _, samples = write_parquet_dataset(store, [9], row_group_size=2)
    reader = make_reader(store, read_manifest(store), fields=["jpg"])
    got = read(reader, Seg(0, 3, 8))
    assert [(s["__key__"], s["jpg"]) for s in got] == [(s["__key__"], s["jpg"]) for s in samples[0][3:8]]


@pytest.mark.slow
def test_reads_from_s3(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/pq", s3_server.options())
    _, samples = write_parquet_dataset(store, [11, 6], row_group_size=3)
    reader = make_reader(Store(store.raw_url, s3_server.options()), read_manifest(store))
    for seg in (Seg(0, 0, 11), Seg(0, 2, 7), Seg(1, 5, 6)):
        assert read(reader, seg) == samples[seg.shard][seg.start : seg.stop]
