"""Tar segment reads against tarfile and webdataset; bad shards and storage faults give clear errors."""

from __future__ import annotations

import dataclasses
import errno
import os
import pickle
import tarfile
import uuid

import pytest

from dataio import ShardFormatError, StorageError
from dataio.format.manifest import read_manifest
from dataio.readers.by_format import make_reader
from dataio.readers.tar import TarReader
from dataio.storage.store import RetryPolicy, Store
from tests.dataio.shardgen import FAST_RETRY, FlakyMemoryFS, Seg, write_tar_dataset

pytestmark = pytest.mark.timeout(120)

def read(reader, seg):
    return reader.parse(seg, reader.fetch(seg))


@pytest.fixture
def local(tmp_path):
    store = Store(str(tmp_path / "ds"), retry=FAST_RETRY)
    manifest, samples = write_tar_dataset(store, [7, 0, 1, 12])
    return store, manifest, samples


def tarfile_samples(path: str) -> list[dict]:
    """What python's tarfile sees: members grouped by key, WebDataset style."""
    out: list[dict] = []
    with tarfile.open(path) as tar:
        for info in tar:
            key, ext = info.name.split(".", 1)
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key})
            out[-1][ext] = tar.extractfile(info).read()
    return out


SEGMENTS = [
    pytest.param(Seg(0, 0, 7), id="whole"),
    pytest.param(Seg(3, 2, 9), id="partial"),
    pytest.param(Seg(0, 4, 5), id="single"),
    pytest.param(Seg(3, 11, 12), id="last"),
    pytest.param(Seg(3, 5, 5), id="empty"),
    pytest.param(Seg(1, 0, 0), id="empty-shard"),
    pytest.param(Seg(2, 0, 1), id="one-sample-shard"),
]


@pytest.mark.parametrize("seg", SEGMENTS)
def test_segment_equals_what_tarfile_sees(local, seg):
    store, manifest, samples = local
    got = read(make_reader(store, manifest), seg)
    assert got == samples[seg.shard][seg.start : seg.stop]
    expect = tarfile_samples(store.path(manifest.shard_paths[seg.shard]))[seg.start : seg.stop]
    assert [{k: v for k, v in s.items() if k not in ("__id__", "__url__")} for s in got] == expect
    offset = sum(manifest.shard_num_samples[: seg.shard])
    assert [s["__id__"] for s in got] == list(range(offset + seg.start, offset + seg.stop))


def test_whole_shards_equal_what_webdataset_sees(local):
    import webdataset as wds

    store, manifest, _ = local
    reader = make_reader(store, manifest)
    for shard in (0, 3):
        url = store.path(manifest.shard_paths[shard])
        seen = [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
                for s in wds.WebDataset(url, shardshuffle=False, empty_check=False)]
        got = read(reader, Seg(shard, 0, manifest.shard_num_samples[shard]))
        assert [{k: v for k, v in s.items() if k not in ("__id__", "__url__")} for s in got] == seen


def test_one_ranged_read_of_exactly_the_span(local):
    store, manifest, _ = local
    reader = make_reader(store, manifest)
    seg = Seg(3, 2, 9)
    estimate = reader.payload_bytes(seg)  # index not loaded yet: proportional estimate
    payload = reader.fetch(seg)
    begin, end = reader.index(3).span(2, 9)
    assert (payload.base, len(payload.data)) == (begin, end - begin)
    assert reader.payload_bytes(seg) == end - begin  # exact once the index is known
    assert 0.5 * (end - begin) < estimate < 2 * (end - begin)


def test_fields_are_projected(local):
    store, manifest, samples = local
    got = read(make_reader(store, manifest, fields=["cls"]), Seg(0, 1, 3))
    assert got == [{"__key__": s["__key__"], "__id__": s["__id__"], "__url__": s["__url__"], "cls": s["cls"]} for s in samples[0][1:3]]
    with pytest.raises(ValueError, match="not in this dataset"):
        make_reader(store, manifest, fields=["png"])


def test_reader_pickles_for_worker_processes(local):
    store, manifest, samples = local
    reader = make_reader(store, manifest)
    read(reader, Seg(0, 0, 2))
    clone = pickle.loads(pickle.dumps(reader))
    assert isinstance(clone, TarReader)
    assert read(clone, Seg(3, 0, 3)) == samples[3][:3]


def test_segment_outside_shard_is_a_value_error(local):
    store, manifest, _ = local
    reader = make_reader(store, manifest)
    with pytest.raises(ValueError, match="outside"):
        reader.fetch(Seg(0, 3, 8))
    with pytest.raises(ValueError, match="outside"):
        reader.fetch(Seg(4, 0, 1))


def test_index_checksum_mismatch_names_the_index(local):
    store, manifest, _ = local
    rel = manifest.index_paths[0]
    data = bytearray(store.read(rel))
    data[-2] = ord("9") if data[-2] != ord("9") else ord("8")  # same length, other bytes
    store.write_bytes(rel, bytes(data))
    with pytest.raises(ShardFormatError, match=r"shard-000000\.tar\.idx: index checksum .* does not match"):
        make_reader(store, manifest).fetch(Seg(0, 0, 1))


def test_malformed_index_is_a_clear_error(local):
    store, manifest, _ = local
    store.write_bytes(manifest.index_paths[3], b"v1.2 12\njpg not-a-number 5 000001.jpg\n")
    with pytest.raises(ShardFormatError, match=r"shard-000003\.tar\.idx: malformed tar index"):
        make_reader(store, manifest, verify_index=False).fetch(Seg(3, 0, 1))


def test_truncated_shard_fails_at_once_naming_the_url(local):
    store, manifest, samples = local
    reader = make_reader(store, manifest)
    with open(store.path(manifest.shard_paths[3]), "r+b") as f:
        f.truncate(reader.index(3).span(11, 12)[1] - 10)  # tarfile pads the end: cut into the data
    assert read(reader, Seg(3, 0, 2)) == samples[3][:2]  # the intact front still reads
    with pytest.raises(StorageError, match=r"shard-000003\.tar bytes .*TruncatedFileError.*the file is shorter"):
        reader.fetch(Seg(3, 10, 12))  # a local file does not grow by asking again: no retries


def test_missing_shard_names_the_url(local):
    store, manifest, _ = local
    os.unlink(store.path(manifest.shard_paths[0]))
    with pytest.raises(StorageError, match=r"shard-000000\.tar.*FileNotFoundError.*check that the path exists"):
        make_reader(store, manifest).fetch(Seg(0, 0, 1))


@pytest.fixture
def flaky():
    store = Store(f"flaky://ds-{uuid.uuid4().hex[:8]}", retry=FAST_RETRY)
    manifest, samples = write_tar_dataset(store, [5, 4])
    FlakyMemoryFS.faults.clear()
    FlakyMemoryFS.shard_reads = 0
    yield store, manifest, samples
    FlakyMemoryFS.faults.clear()


TRANSIENT = [
    pytest.param(OSError(errno.EBUSY, "Service Unavailable"), id="s3fs-503"),
    pytest.param(OSError(121, "We encountered an internal error. Please try again."), id="s3fs-500"),
    pytest.param(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), id="reset"),
    pytest.param(TimeoutError("read timed out"), id="timeout"),
    pytest.param("short", id="short-read"),
]


@pytest.mark.parametrize("fault", TRANSIENT)
def test_transient_faults_are_retried(flaky, fault):
    store, manifest, samples = flaky
    FlakyMemoryFS.faults[:] = [fault, fault]
    assert read(make_reader(store, manifest), Seg(1, 1, 4)) == samples[1][1:4]
    assert FlakyMemoryFS.shard_reads == 3


def test_persistent_fault_gives_up_naming_url_and_attempts(flaky):
    store, manifest, _ = flaky
    FlakyMemoryFS.faults[:] = [OSError(errno.EBUSY, "Service Unavailable")] * 5
    with pytest.raises(StorageError, match=r"flaky://ds-.*shard-000000\.tar bytes .*gave up after 3 attempts"):
        make_reader(store, manifest).fetch(Seg(0, 0, 5))
    assert FlakyMemoryFS.shard_reads == 3


def test_permanent_fault_is_not_retried(flaky):
    store, manifest, _ = flaky
    FlakyMemoryFS.faults[:] = [PermissionError("Access Denied")]
    with pytest.raises(StorageError, match="PermissionError"):
        make_reader(store, manifest).fetch(Seg(0, 0, 5))
    assert FlakyMemoryFS.shard_reads == 1


def test_reads_from_memory_url():
    store = Store(f"memory://ds-{uuid.uuid4().hex[:8]}")
    write_tar_dataset(store, [3, 5])
    manifest = read_manifest(store)
    reader = make_reader(store, manifest)
    assert [s["__key__"] for s in read(reader, Seg(1, 2, 5))] == ["000005", "000006", "000007"]


@pytest.mark.slow
def test_reads_from_s3(s3_server):
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    _, samples = write_tar_dataset(store, [6, 9])
    reader = make_reader(Store(store.raw_url, s3_server.options()), read_manifest(store))
    for seg in (Seg(0, 0, 6), Seg(1, 3, 8), Seg(1, 8, 9)):
        assert read(reader, seg) == samples[seg.shard][seg.start : seg.stop]


@pytest.mark.slow
def test_s3_faults_through_the_proxy_are_retried_to_exact_samples(s3_server):
    from tools.delay_proxy import DelayProxy

    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    manifest, samples = write_tar_dataset(store, [8, 8, 8])
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, error_rate=0.2, truncate_rate=0.2,
                    reset_rate=0.1, seed=7) as proxy:
        faulty = Store(store.raw_url, dataclasses.replace(s3_server.options(), endpoint_url=proxy.url),
                       RetryPolicy(max_attempts=30, base_delay_s=0.0, max_delay_s=0.0))
        reader = make_reader(faulty, manifest)
        for seg in (Seg(0, 0, 8), Seg(1, 2, 5), Seg(2, 7, 8), Seg(1, 5, 8)):
            assert read(reader, seg) == samples[seg.shard][seg.start : seg.stop]
        stats = proxy.stats
        assert stats.num_errors + stats.num_truncated + stats.num_resets > 0


@pytest.mark.slow
def test_s3_outage_gives_up_naming_the_url_without_credentials(s3_server):
    from tools.delay_proxy import DelayProxy

    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    manifest, _ = write_tar_dataset(store, [4])
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0, error_rate=1.0) as proxy:
        options = dataclasses.replace(s3_server.options(), endpoint_url=proxy.url)
        down = Store(store.raw_url, options, RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0))
        with pytest.raises(StorageError, match=r"s3://.*/ds/shards/shard-000000\.tar\.idx: gave up after 2") as info:
            make_reader(down, manifest).fetch(Seg(0, 0, 4))
        assert s3_server.secret not in str(info.value) and s3_server.key not in str(info.value)


def _client_errors() -> list:
    import aiohttp
    import botocore.exceptions as boto

    return [
        (boto.ConnectionClosedError(endpoint_url="http://s3"), True),
        (boto.EndpointConnectionError(endpoint_url="http://s3"), True),
        (boto.ReadTimeoutError(endpoint_url="http://s3"), True),
        (boto.ConnectTimeoutError(endpoint_url="http://s3"), True),
        (boto.IncompleteReadError(actual_bytes=1, expected_bytes=2), True),
        (aiohttp.ServerDisconnectedError(), True),
        (aiohttp.ClientPayloadError("Response payload is not completed"), True),
        (OSError(errno.EBUSY, "Please reduce your request rate."), True),  # s3fs: 503 SlowDown
        (OSError(getattr(errno, "EREMOTEIO", 121), "We encountered an internal error."), True),  # 500
        (FileNotFoundError("The specified key does not exist."), False),
        (PermissionError("Access Denied"), False),
        (OSError(errno.EINVAL, "The requested range is not satisfiable"), False),
    ]


def test_is_transient_knows_what_s3fs_botocore_and_aiohttp_raise():
    from dataio.storage.store import is_transient

    for exc, transient in _client_errors():
        assert is_transient(exc) is transient, repr(exc)


# ---- metadata caches: bounded in entries and in bytes, thread-safe, pickled empty
class _Sized:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_a_cache_keeps_its_byte_budget_and_the_entry_used_last():
    from dataio.readers.base import LruCache, nbytes_of

    cache = LruCache(64, max_bytes=100, size_of=nbytes_of)
    for key in range(5):
        cache.get_or_load(key, lambda: _Sized(30))
    assert len(cache) == 3 and cache.num_bytes == 90 and cache.get(1) is None and cache.get(4) is not None
    cache.get(2)  # used: now the newest but one
    cache.get_or_load(9, lambda: _Sized(30))
    assert cache.get(3) is None and cache.get(2) is not None  # the least recently used went
    big = cache.get_or_load("big", lambda: _Sized(1000))  # over the whole budget: kept, alone
    assert len(cache) == 1 and cache.get("big") is big and cache.num_bytes == 1000
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 0 and clone.max_bytes == 100
    clone.get_or_load(1, lambda: _Sized(60))
    clone.get_or_load(2, lambda: _Sized(60))
    assert len(clone) == 1  # the bound survived the pickle


def test_a_cache_shared_by_threads_stays_within_its_bounds():
    import threading

    from dataio.readers.base import LruCache, nbytes_of

    cache = LruCache(8, max_bytes=10_000, size_of=nbytes_of)

    def use(seed: int) -> None:
        for i in range(2000):
            key = (seed * 7919 + i * 31) % 50
            assert cache.get_or_load(key, lambda: _Sized(1000 + key)).nbytes == 1000 + key

    threads = [threading.Thread(target=use, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(cache) <= 8 and cache.num_bytes <= 10_000
    assert cache.num_bytes == sum(1000 + k for k in cache._items)  # the count matches what is held


def test_the_index_caches_hold_shards_of_many_small_samples_by_bytes(local, monkeypatch):
    import dataio.readers.tar as tar_module

    store, manifest, _ = local
    monkeypatch.setattr(tar_module, "INDEX_CACHE_BYTES", 1)  # every index over the budget: one kept
    reader = TarReader(store, manifest, verify_checksums=True)
    for shard in (0, 2, 3):
        assert reader.index(shard) is reader.index(shard)
        reader.sample_sums(shard)
    assert len(reader._indexes) == 1 and len(reader._sums) == 1
    first = read(reader, Seg(0, 0, 7))
    assert [s["__key__"] for s in first] == [s["__key__"] for s in read(TarReader(store, manifest), Seg(0, 0, 7))]


@pytest.mark.parametrize("first", ["sample_sums", "index"])
def test_object_storage_fetches_a_shards_index_and_sidecar_once(first, monkeypatch):
    # Whichever is asked for first, a shard's index and checksum sidecar are one GET each (side by
    # side); asking for the checksums first used to fetch the sidecar twice.
    store = Store(f"memory://ds-{uuid.uuid4().hex[:8]}")
    write_tar_dataset(store, [3, 5])
    reader = TarReader(store, read_manifest(store), verify_checksums=True)
    reads: list[str] = []
    original = Store.read

    def counting(self, path, *args, **kwargs):
        reads.append(path)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(Store, "read", counting)
    getattr(reader, first)(1)
    reader.sample_sums(1), reader.index(1)
    assert sorted(p.rsplit(".", 1)[-1] for p in reads) == ["idx", "sums"], reads
