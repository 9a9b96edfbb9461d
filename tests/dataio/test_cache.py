"""DiskCache: hits, LRU eviction to the limit, several processes on one directory, stream-through."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import stat
import time

import pytest

from dataio import StorageError
from dataio.readers.by_format import make_reader
from dataio.storage.cache import DiskCache
from dataio.storage.store import Store
from tests.dataio.shardgen import Seg, write_parquet_dataset, write_tar_dataset

pytestmark = pytest.mark.timeout(60)


def blob(i: int, size: int) -> bytes:
    return bytes([i % 251]) * size


class Source:
    """A fetch that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def get(self, cache: DiskCache, i: int, size: int = 1000) -> bytes:
        def fetch() -> bytes:
            self.calls += 1
            return blob(i, size)

        return cache.get_or_fetch(namespace="s3://b/ds", path=f"shards/{i}.tar", start=0, end=size,
                                  checksum="c0ffee", fetch=fetch)


def test_second_read_is_a_hit(tmp_path):
    cache, source = DiskCache(str(tmp_path / "c"), limit_bytes=10_000), Source()
    assert source.get(cache, 1) == blob(1, 1000)
    assert source.get(cache, 1) == blob(1, 1000)
    assert source.calls == 1 and (cache.stats.hits, cache.stats.misses) == (1, 1)
    other = DiskCache(str(tmp_path / "c"), limit_bytes=10_000)  # another process, same host
    assert source.get(other, 1) == blob(1, 1000) and source.calls == 1


def test_key_includes_range_and_checksum(tmp_path):
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=10_000)
    paths = {cache.entry_path(namespace="u", path="p", start=s, end=e, checksum=c)
             for s, e, c in [(0, 10, "a"), (0, 11, "a"), (1, 10, "a"), (0, 10, "b")]}
    assert len(paths) == 4


def test_eviction_keeps_the_limit_and_recent_entries(tmp_path):
    cache, source = DiskCache(str(tmp_path / "c"), limit_bytes=10_000), Source()
    source.get(cache, 0)
    for i in range(1, 30):
        time.sleep(0.002)  # distinct mtimes
        source.get(cache, i)
        source.get(cache, 0)  # keep entry 0 hot
        assert cache.size_bytes() <= 10_000
    calls = source.calls
    source.get(cache, 0)
    source.get(cache, 29)
    assert source.calls == calls  # the hot and the newest survived
    source.get(cache, 1)
    assert source.calls == calls + 1  # the oldest cold one was evicted
    assert cache.stats.evicted > 0


def test_entry_larger_than_the_limit_streams_through(tmp_path):
    cache, source = DiskCache(str(tmp_path / "c"), limit_bytes=500), Source()
    assert source.get(cache, 7, size=1000) == blob(7, 1000)
    assert source.get(cache, 7, size=1000) == blob(7, 1000)
    assert source.calls == 2 and cache.stats.streamed == 2
    assert not os.path.exists(cache.root) or cache.size_bytes() == 0


def test_damaged_entry_is_refetched(tmp_path):
    cache, source = DiskCache(str(tmp_path / "c"), limit_bytes=10_000), Source()
    source.get(cache, 3)
    entry = cache.entry_path(namespace="s3://b/ds", path="shards/3.tar", start=0, end=1000, checksum="c0ffee")
    with open(entry, "r+b") as f:
        f.truncate(10)
    assert source.get(cache, 3) == blob(3, 1000) and source.calls == 2


def test_entry_changed_in_place_is_refused_not_served(tmp_path):
    """Issue 9: a cache entry changed on disk (same size) was served silently."""
    cache, source = DiskCache(str(tmp_path / "c"), limit_bytes=10_000), Source()
    source.get(cache, 3)
    entry = cache.entry_path(namespace="s3://b/ds", path="shards/3.tar", start=0, end=1000, checksum="c0ffee")
    with open(entry, "r+b") as f:
        f.seek(500)
        f.write(b"X")
    assert source.get(cache, 3) == blob(3, 1000) and source.calls == 2 and cache.stats.refused == 1
    assert source.get(cache, 3) == blob(3, 1000) and source.calls == 2  # the re-read entry is whole again


def test_private_directory_per_user(tmp_path):
    cache, source = DiskCache(str(tmp_path / "c"), limit_bytes=10_000), Source()
    source.get(cache, 1)
    assert cache.root.endswith(f"user-{os.getuid()}")
    assert stat.S_IMODE(os.stat(cache.root).st_mode) == 0o700
    os.chmod(cache.root, 0o755)
    with pytest.raises(StorageError, match="not a private directory"):
        DiskCache(str(tmp_path / "c"), limit_bytes=10_000).size_bytes()


def test_pickles_without_state(tmp_path):
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1234)
    clone = pickle.loads(pickle.dumps(cache))
    assert (clone.directory, clone.limit_bytes, clone.root) == (cache.directory, 1234, cache.root)


def _hammer(directory: str, seed: int, rounds: int) -> None:
    cache = DiskCache(directory, limit_bytes=20_000)
    for r in range(rounds):
        i = (r * 7 + seed) % 40
        data = Source().get(cache, i, size=900 + i)
        assert data == blob(i, 900 + i), f"entry {i} came back wrong"


@pytest.mark.slow
def test_two_processes_share_one_directory(tmp_path):
    directory = str(tmp_path / "c")
    ctx = mp.get_context("fork")  # no s3fs here; fork keeps the test fast
    procs = [ctx.Process(target=_hammer, args=(directory, seed, 300)) for seed in (0, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=50)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = DiskCache(directory, limit_bytes=20_000)
    cache.evict()  # each process keeps the limit to within its own last few inserts
    assert cache.size_bytes() <= 20_000
    source = Source()
    for i in range(40):
        assert source.get(cache, i, size=900 + i) == blob(i, 900 + i)
    assert not os.listdir(os.path.join(cache.root, "tmp"))  # no temporaries left behind


def test_tar_reader_serves_segments_from_the_cache(tmp_path):
    store = Store(str(tmp_path / "ds"))
    manifest, samples = write_tar_dataset(store, [6, 5])
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1 << 20)
    reader = make_reader(store, manifest, cache=cache)
    segments = [Seg(0, 0, 3), Seg(0, 3, 6), Seg(1, 0, 5)]
    first = [reader.parse(s, reader.fetch(s)) for s in segments]
    for rel in manifest.shard_paths:
        os.unlink(store.path(rel))  # from now on only the cache has the bytes
    again = [reader.parse(s, reader.fetch(s)) for s in segments]
    assert again == first == [samples[s.shard][s.start : s.stop] for s in segments]
    assert (cache.stats.hits, cache.stats.misses) == (3, 3)


def test_parquet_reader_serves_segments_from_the_cache(tmp_path):
    store = Store(str(tmp_path / "ds"))
    manifest, samples = write_parquet_dataset(store, [9], row_group_size=3)
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1 << 20)
    reader = make_reader(store, manifest, cache=cache)
    seg = Seg(0, 2, 7)
    first = reader.parse(seg, reader.fetch(seg))
    os.unlink(store.path(manifest.shard_paths[0]))
    assert reader.parse(seg, reader.fetch(seg)) == first == samples[0][2:7]


def test_reader_with_a_cache_smaller_than_a_segment_still_reads(tmp_path):
    store = Store(str(tmp_path / "ds"))
    manifest, samples = write_tar_dataset(store, [6])
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=100)
    reader = make_reader(store, manifest, cache=cache)
    for _ in range(2):
        assert reader.parse(Seg(0, 0, 6), reader.fetch(Seg(0, 0, 6))) == samples[0]
    assert cache.stats.streamed == 2 and cache.stats.hits == 0
