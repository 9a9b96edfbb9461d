"""Checksums at the granularity workers read (issue 9): a byte changed inside one sample of a shard,
same size so every size check passes, is caught by verify_checksums=True naming the shard and the
sample, while the other samples still read; the same for a Parquet row group and a cache entry.
Each of these tests failed before the per-sample / per-row-group checksums existed (the changed
bytes were delivered silently)."""

from __future__ import annotations

import io
import os
import shutil
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import xxhash

from dataio import ShardFormatError, UnverifiedDataWarning, make_loader
from dataio.format.checksums import (
    SpanSums,
    chunk_span,
    dumps_sums,
    file_row_group_sums,
    first_bad_sample,
    parse_sums,
    sample_sums,
    sums_path,
)
from dataio.format.manifest import read_manifest
from dataio.format.tar_index import build_index
from dataio.readers.by_format import make_reader
from dataio.storage.cache import DIGEST_BYTES, DiskCache
from dataio.storage.store import Store
from tests.dataio.shardgen import (
    Seg,
    tar_bytes,
    write_parquet_dataset,
    write_tar_dataset,
)

LEGACY = Path(__file__).parent.parent / "fixtures" / "legacy"


def flip_byte(path: str, offset: int) -> None:
    """Change one byte in place: the file keeps its size."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x5A]))


def read(reader, seg):
    return reader.parse(seg, reader.fetch(seg))


def raw_keys(url: str, **kw) -> list[str]:
    """Every sample's key, one epoch, in-process, raw bytes."""
    loader = make_loader(url, batch_size=1, num_workers=0, decode=None, shuffle=False, tail="pad", **kw)
    loader.set_epoch(0)
    return [k for b in loader for k in b["__key__"]]


# --- the format -----------------------------------------------------------------------------


def test_sidecar_round_trip_and_refusal():
    data = tar_bytes([{"__key__": f"{i:03d}", "jpg": os.urandom(700 + i), "cls": i, "json": b"{}"} for i in range(5)])
    index = build_index(io.BytesIO(data))
    sums = sample_sums(data, index.samples)
    assert sums[0] == xxhash.xxh3_64_intdigest(data[slice(*index.span(0, 1))])  # a sample's data span
    blob = dumps_sums(sums)
    assert parse_sums(blob, num_samples=5, url="u") == sums
    with pytest.raises(ShardFormatError, match="not a checksum sidecar of 4 samples"):
        parse_sums(blob, num_samples=4, url="u")
    begin, end = index.span(1, 4)
    assert first_bad_sample(data[begin:end], begin, index.samples[1:4], sums[1:4]) is None
    changed = bytearray(data)
    changed[index.samples[2].members[1].offset] ^= 1  # sample 2's second member
    assert first_bad_sample(bytes(changed[begin:end]), begin, index.samples[1:4], sums[1:4]) == 1
    assert sums_path("shards/shard-000042.tar") == "shards/shard-000042.sums"


def test_streamed_row_group_sums_match_the_whole_file(tmp_path):
    _, _ = write_parquet_dataset(Store(str(tmp_path)), [13], row_group_size=4)
    data = (tmp_path / "shards" / "shard-000000.parquet").read_bytes()
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    whole = file_row_group_sums(io.BytesIO(data))
    assert len(whole) == md.num_row_groups == 4 and all(len(g) == 16 * md.num_columns for g in whole)
    for step in (1, 333, len(data)):
        spans = SpanSums(md)
        for a in range(0, len(data), step):
            spans.update(a, data[a : a + step])
        assert spans.hexdigests() == whole


# --- tar: one changed sample ----------------------------------------------------------------


def _flip_tar_sample(store: Store, shard: int, sample: int) -> str:
    reader = make_reader(store, read_manifest(store))
    member = reader.index(shard).samples[sample].members[0]
    flip_byte(store.path(read_manifest(store).shard_paths[shard]), member.offset + member.size // 2)
    return reader.index(shard).samples[sample].key


def test_tar_reader_names_the_changed_sample_and_reads_the_others(tmp_path):
    store = Store(str(tmp_path))
    manifest, samples = write_tar_dataset(store, [6, 4])
    key = _flip_tar_sample(store, 0, 3)
    quiet = make_reader(store, manifest)  # without verify_checksums: the changed bytes pass silently
    assert read(quiet, Seg(0, 0, 6))[3]["jpg"] != samples[0][3]["jpg"]
    reader = make_reader(store, manifest, verify_checksums=True)
    with pytest.raises(ShardFormatError) as err:
        reader.fetch(Seg(0, 2, 5))
    message = str(err.value)
    assert store.url_of(manifest.shard_paths[0]) in message and repr(key) in message
    assert "shardify verify" in message and "rewrite" in message
    assert read(reader, Seg(0, 0, 3)) == samples[0][:3] and read(reader, Seg(0, 4, 6)) == samples[0][4:]
    assert read(reader, Seg(1, 0, 4)) == samples[1]


def test_loader_with_verify_checksums_fails_naming_shard_and_key(tmp_path):
    store = Store(str(tmp_path))
    manifest, _ = write_tar_dataset(store, [5, 5])
    key = _flip_tar_sample(store, 1, 2)
    assert len(raw_keys(str(tmp_path), verify_checksums=False)) == 10  # what happened before: served silently
    for num_workers in (0, 1):
        loader = make_loader(str(tmp_path), batch_size=2, num_workers=num_workers, decode=None,
                             verify_checksums=True, multiprocessing_context="spawn" if num_workers else None)
        loader.set_epoch(0)
        try:
            with pytest.raises(ShardFormatError) as err:
                list(loader)
        finally:
            loader.close()
        assert manifest.shard_paths[1] in str(err.value) and repr(key) in str(err.value)


def test_a_changed_sidecar_is_refused(tmp_path):
    store = Store(str(tmp_path))
    manifest, _ = write_tar_dataset(store, [4])
    flip_byte(store.path(sums_path(manifest.shard_paths[0])), 20)
    with pytest.raises(ShardFormatError, match=r"shard-000000.sums: checksum .* does not match the manifest"):
        make_reader(store, manifest, verify_checksums=True).fetch(Seg(0, 0, 1))


# --- Parquet: one changed row group ---------------------------------------------------------


def _flip_parquet_chunk(store: Store, shard: int, group: int, column: str) -> None:
    path = store.path(read_manifest(store).shard_paths[shard])
    md = pq.ParquetFile(path).metadata
    rg = md.row_group(group)
    cc = next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == column)
    a, b = chunk_span(cc)
    flip_byte(path, (a + b) // 2)  # inside the values (random bytes: snappy stores them as a literal)


def test_parquet_reader_names_the_changed_row_group(tmp_path):
    store = Store(str(tmp_path))
    manifest, samples = write_parquet_dataset(store, [12], row_group_size=4)
    _flip_parquet_chunk(store, 0, 1, "jpg")  # rows 4-7: decodes fine, silently wrong
    assert read(make_reader(store, manifest), Seg(0, 0, 12)) != samples[0]
    reader = make_reader(store, manifest, verify_checksums=True)
    with pytest.raises(ShardFormatError) as err:
        reader.fetch(Seg(0, 3, 6))
    message = str(err.value)
    assert store.url_of(manifest.shard_paths[0]) in message and "row group 1 (rows 4-7" in message
    assert "'000004'..'000007'" in message and "'jpg'" in message and "shardify verify" in message
    assert read(reader, Seg(0, 0, 4)) == samples[0][:4] and read(reader, Seg(0, 8, 12)) == samples[0][8:]
    # a projection that does not read the changed column reads fine: only what is read is checked
    assert [s["cls"] for s in read(make_reader(store, manifest, fields=["cls"], verify_checksums=True),
                                   Seg(0, 4, 8))] == [s["cls"] for s in samples[0][4:8]]


def test_parquet_loader_with_verify_checksums_fails(tmp_path):
    store = Store(str(tmp_path))
    manifest, _ = write_parquet_dataset(store, [8, 8], row_group_size=4)
    _flip_parquet_chunk(store, 1, 0, "jpg")
    loader = make_loader(str(tmp_path), batch_size=4, num_workers=0, decode=None, verify_checksums=True)
    loader.set_epoch(0)
    with pytest.raises(ShardFormatError, match=r"shard-000001.parquet: row group 0 \(rows 0-3"):
        list(loader)


# --- the disk cache -------------------------------------------------------------------------


def _tamper_entry(reader, cache: DiskCache) -> None:
    """Change one byte of sample 3's data (tar) / row group 0's jpg values (Parquet) in the cache entry
    holding it, and re-seal the entry's digest, so the cache's own check passes."""
    store, manifest = reader.store, reader.manifest
    if manifest.format == "tar":
        begin, end = reader.index(0).span(0, 8)
        at = reader.index(0).samples[3].members[0].offset + 1
    else:
        md = reader.metadata(0)
        begin, end = reader._ranges(md, [0, 1])[0]
        rg = md.row_group(0)
        a, b = chunk_span(next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == "jpg"))
        at = (a + b) // 2
    path = cache.entry_path(namespace=store.url, path=manifest.shard_paths[0], start=begin, end=end,
                            checksum=manifest.shard_checksums[0])
    data = bytearray(Path(path).read_bytes()[:-DIGEST_BYTES])
    data[at - begin] ^= 0x5A
    Path(path).write_bytes(bytes(data) + xxhash.xxh3_64_digest(bytes(data)))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_changed_cache_entry_is_dropped_and_read_again(tmp_path, fmt):
    store = Store(str(tmp_path / "ds"))
    write = write_tar_dataset if fmt == "tar" else write_parquet_dataset
    manifest, samples = write(store, [8])
    seg = Seg(0, 0, 8)
    quiet = make_reader(store, manifest, cache=DiskCache(str(tmp_path / "c0"), limit_bytes=1 << 20))
    assert read(quiet, seg) == samples[0]
    _tamper_entry(quiet, quiet.cache)
    assert read(quiet, seg) != samples[0]  # before: a changed (re-sealed) entry was served as is
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1 << 20)
    reader = make_reader(store, manifest, cache=cache, verify_checksums=True)
    assert read(reader, seg) == samples[0]
    _tamper_entry(reader, cache)
    assert read(reader, seg) == samples[0]  # the store's bytes, not the entry's
    assert cache.stats.refused == 1
    assert read(reader, seg) == samples[0] and cache.stats.refused == 1  # cached again, intact


def test_a_changed_shard_behind_a_cache_still_fails(tmp_path):
    store = Store(str(tmp_path / "ds"))
    manifest, _ = write_tar_dataset(store, [6])
    _flip_tar_sample(store, 0, 1)
    reader = make_reader(store, manifest, cache=DiskCache(str(tmp_path / "c"), limit_bytes=1 << 20),
                         verify_checksums=True)
    with pytest.raises(ShardFormatError, match="000001"):
        reader.fetch(Seg(0, 0, 6))


# --- datasets written before ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["tar", "parquet", "parted_tar"])
def test_a_dataset_written_before_loads_unverified_with_one_note(tmp_path, name):
    """Stored fixtures written by shardify before the version bump (manifest versions 1 and 2)."""
    ds = shutil.copytree(LEGACY / name, tmp_path / name)
    manifest = read_manifest(Store(str(ds)))
    assert not manifest.has_read_checksums and manifest.version == (2 if name.startswith("parted") else 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = raw_keys(str(ds), verify_checksums=True)
    notes = [w for w in caught if issubclass(w.category, UnverifiedDataWarning)]
    assert len(keys) == 4 and len(notes) == 1  # one note for the dataset, not one per shard
    assert str(ds) in str(notes[0].message) and "unverified" in str(notes[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedDataWarning)
        assert len(raw_keys(str(ds), verify_checksums=False)) == 4  # asked for no checks: no note


def test_a_new_dataset_gives_no_note(tmp_path):
    write_tar_dataset(Store(str(tmp_path)), [3])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedDataWarning)
        assert len(raw_keys(str(tmp_path), verify_checksums=True)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_s3_reads_through_the_disk_cache_are_checked(s3_server, tmp_path, fmt):
    """Remote reads, then the same epoch from the disk cache: both checked, both whole; a re-sealed
    changed entry is read again from the bucket."""
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    manifest, samples = (write_tar_dataset if fmt == "tar" else write_parquet_dataset)(store, [8, 5])
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1 << 24)
    reader = make_reader(Store(store.raw_url, s3_server.options()), read_manifest(store), cache=cache,
                         verify_checksums=True)
    for _ in range(2):
        assert read(reader, Seg(0, 0, 8)) == samples[0] and read(reader, Seg(1, 1, 5)) == samples[1][1:]
    assert cache.stats.hits == cache.stats.misses > 0
    _tamper_entry(reader, cache)
    assert read(reader, Seg(0, 0, 8)) == samples[0] and cache.stats.refused == 1


@pytest.mark.parametrize("second", ["tar", "parquet"])
def test_a_mixture_checks_every_source(tmp_path, second):
    """A changed sample in the second source of a 1:1 mixture fails naming that source's shard and key
    (the RAW path reads a mixture of tar sources itself; a Parquet source goes through its reader)."""
    first, other = Store(str(tmp_path / "a")), Store(str(tmp_path / "b"))
    write_tar_dataset(first, [6, 6])
    if second == "tar":
        write_tar_dataset(other, [6, 6], seed=1)
        key = _flip_tar_sample(other, 1, 4)
    else:
        write_parquet_dataset(other, [6, 6], seed=1)
        _flip_parquet_chunk(other, 1, 1, "jpg")
        key = "row group 1"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnverifiedDataWarning)
        loader = make_loader([first.raw_url, other.raw_url], weights=[1, 1], batch_size=4, num_workers=0,
                             decode=None, tail="pad")
    with loader, pytest.raises(ShardFormatError) as err:
        loader.set_epoch(0)
        list(loader)
    assert str(tmp_path / "b") in str(err.value) and key in str(err.value)
