"""S3 ranged reads through botocore's thread-safe client (storage/s3_ranges.py), as Store.read serves them."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from dataio.errors import StorageError, StorageNotFoundError
from dataio.storage import s3_ranges
from dataio.storage.retry import RetryPolicy
from dataio.storage.store import Store

pytestmark = pytest.mark.timeout(120)


def test_ranged_reads_from_many_threads_are_exact(s3_server) -> None:
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    data = bytes(range(256)) * 4096  # 1 MiB
    store.write_bytes("blob", data)
    spans = [(a, a + 100_003) for a in range(0, len(data) - 100_003, 70_001)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda s: store.read("blob", *s), spans))
    assert got == [data[a:b] for a, b in spans]
    assert store._range_options is not None  # served by s3_ranges, not s3fs
    assert s3_ranges.client_for(store._range_options) is s3_ranges.client_for(store._range_options)


def test_reads_open_no_s3fs_filesystem(s3_server) -> None:
    """The read path (a loader's start-up: manifest, indexes, windows) goes through botocore alone:
    building an s3fs filesystem (and importing s3fs) took as long as the first request on a loaded machine."""
    bucket = s3_server.new_bucket()
    Store(f"s3://{bucket}/ds", s3_server.options()).write_bytes("blob", b"0123456789")
    store = Store(f"s3://{bucket}/ds/", s3_server.options())
    assert store.read("blob") == b"0123456789" and store.read("blob", 2, 5) == b"234"
    assert store.sizes_on_read and store._fs is None
    assert store.size("blob") == 10 and store._fs is not None  # what needs the filesystem still opens it


def test_errors_are_judged_as_s3fs_ones(s3_server) -> None:
    fast = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options(), fast)
    store.write_bytes("blob", b"x" * 1000)
    with pytest.raises(StorageNotFoundError, match="missing"):
        store.read("missing", 0, 10)
    with pytest.raises(StorageError, match="blob bytes 2000-2010"):
        store.read("blob", 2000, 2010)  # past the end: a short read, retried, then refused
    with pytest.raises(StorageError, match="blob bytes 990-1010") as err:
        store.read("blob", 990, 1010)  # 10 of 20 bytes
    assert "got 10 bytes, expected 20" in str(err.value.__cause__)
    wrong = dataclasses.replace(s3_server.options(), secret="not-the-secret")
    with pytest.raises(StorageError) as err:
        Store(store.raw_url, wrong, fast).read("blob", 0, 10)
    assert "not-the-secret" not in str(err.value)
