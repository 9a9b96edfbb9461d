"""S3 reads as Store.read and Store.read_into serve them (storage/s3_into.py: presigned GETs through urllib3,
bodies received in place), against SeaweedFS; botocore's client (s3_ranges) only for conditional writes."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from dataio.errors import ShardFormatError, StorageError, StorageNotFoundError
from dataio.storage import s3_into, s3_ranges
from dataio.storage.options import StorageOptions
from dataio.storage.retry import RetryPolicy
from dataio.storage.store import Store
from tools.s3_server import S3Server

pytestmark = pytest.mark.timeout(120)


def test_ranged_reads_from_many_threads_are_exact(s3_server) -> None:
    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    data = bytes(range(256)) * 4096  # 1 MiB
    store.write_bytes("blob", data)
    spans = [(a, a + 100_003) for a in range(0, len(data) - 100_003, 70_001)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda s: store.read("blob", *s), spans))
    assert got == [data[a:b] for a, b in spans]
    assert store._range_options is not None  # served by s3_into, not s3fs
    assert s3_ranges.client_for(store._range_options) is s3_ranges.client_for(store._range_options)


def test_reads_build_no_botocore_client(s3_server) -> None:
    """Building botocore's client loads the S3 service model (0.1-0.4 s of a loader's first batch): reads
    sign their URLs without one."""
    options = dataclasses.replace(s3_server.options(), read_timeout_s=9.5)  # options no other test's client has
    store = Store(f"s3://{s3_server.new_bucket()}/ds", options)
    s3_ranges.client_for(s3_server.options()).put_object(Bucket=store.root.split("/")[0], Key="ds/blob", Body=b"xyz")
    assert store.read("blob") == b"xyz" and store.read("blob", 1, 3) == b"yz"
    assert not any(o == options for _, o in s3_ranges._CLIENTS)


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


def test_read_into_fills_the_buffer_in_parallel_parts_exactly(s3_server) -> None:
    options = dataclasses.replace(s3_server.options(), part_bytes=100_000, parts_in_flight=4)
    store = Store(f"s3://{s3_server.new_bucket()}/ds", options)
    data = bytes(range(256)) * 4096  # 1 MiB: 7-10 parts per span below
    store.write_bytes("blob", data)
    for start, end in [(0, len(data)), (12_345, 987_654), (500, 501), (len(data) - 7, len(data))]:
        dest = bytearray(b"\xee" * (end - start + 3))
        store.read_into("blob", start, end, memoryview(dest), object_size=len(data))
        assert dest[: end - start] == data[start:end] and dest[end - start:] == b"\xee" * 3


def test_part_spans_cover_the_span_once_in_about_equal_parts() -> None:
    assert s3_into.part_spans(0, 10, 4) == [(0, 5), (5, 10)]  # parts of about 4: two of 5
    for start, end, part in [(3, 1000, 7), (0, 1, 8 << 20), (10, 50 << 20, 8 << 20)]:
        spans = s3_into.part_spans(start, end, part)
        assert spans[0][0] == start and spans[-1][1] == end
        assert all(a < b and b == c for (a, b), (c, _) in zip(spans, spans[1:] + [(end, None)]))
        assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= len(spans)


def test_read_into_checks_the_size_and_the_range(s3_server) -> None:
    fast = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    store = Store(f"s3://{s3_server.new_bucket()}/ds", dataclasses.replace(s3_server.options(), part_bytes=300), fast)
    store.write_bytes("blob", b"x" * 1000)
    dest = memoryview(bytearray(2000))
    with pytest.raises(ShardFormatError, match="blob: shard is 1000 bytes but the manifest says 999"):
        store.read_into("blob", 0, 500, dest, object_size=999)
    with pytest.raises(StorageError, match="blob bytes 674-1010") as err:  # parts of 337 bytes
        store.read_into("blob", 0, 1010, dest)  # its last part runs past the end: retried, then refused
    assert "answered bytes 674-999/1000" in str(err.value)
    with pytest.raises(StorageNotFoundError, match="missing"):
        store.read_into("missing", 0, 10, dest)
    wrong = dataclasses.replace(store.options, secret="not-the-secret")
    with pytest.raises(StorageError, match="SignatureDoesNotMatch|AccessDenied|403") as err:
        Store(store.raw_url, wrong, fast).read_into("blob", 0, 10, dest)  # refused: not retried
    assert "not-the-secret" not in str(err.value) and "gave up" not in str(err.value)


def test_options_refuse_a_part_size_below_one() -> None:
    with pytest.raises(ValueError, match="part_bytes"):
        StorageOptions(part_bytes=0)
    with pytest.raises(ValueError, match="parts_in_flight"):
        StorageOptions(parts_in_flight=True)


@pytest.mark.slow
def test_reads_over_https_trust_the_ca_bundle(monkeypatch) -> None:
    """SeaweedFS over TLS (a self-signed certificate): reads verify it against AWS_CA_BUNDLE, as botocore does."""
    with S3Server(tls=True) as server:
        assert server.endpoint_url.startswith("https://") and server.ca_file
        bucket = server.new_bucket()
        server.client().put_object(Bucket=bucket, Key="ds/blob", Body=bytes(range(256)) * 40)
        fast = RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0)
        untrusted = Store(f"s3://{bucket}/ds", dataclasses.replace(server.options(), read_timeout_s=9.1), fast)
        with pytest.raises(StorageError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            untrusted.read("blob")
        monkeypatch.setenv("AWS_CA_BUNDLE", server.ca_file)
        store = Store(f"s3://{bucket}/ds", dataclasses.replace(server.options(), read_timeout_s=9.2, part_bytes=4000))
        dest = bytearray(10240)
        store.read_into("blob", 0, 10240, memoryview(dest))
        assert store.read("blob", 3, 7) == bytes([3, 4, 5, 6]) and bytes(dest) == bytes(range(256)) * 40


def test_listing_goes_through_urllib3_pages_and_all(s3_server, monkeypatch) -> None:
    """Store.list on S3: ListObjectsV2 pages through urllib3 (no s3fs imported or built), every key below
    the prefix and none beside it; a missing prefix or bucket lists nothing."""
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    names = [f"d/{i:04d}" for i in range(7)] + ["d/sub/x y.tar", "dx/not-mine"]
    for name in names:
        client.put_object(Bucket=bucket, Key=f"ds/{name}", Body=b"1")
    store = Store(f"s3://{bucket}/ds/d", s3_server.options())
    real = s3_into.get_listing
    pages: list[str] = []
    monkeypatch.setattr(s3_into, "get_listing", lambda o, b, q: pages.append(q) or real(o, b, q + "&max-keys=3"))
    assert store.list() == sorted(n[2:] for n in names if n.startswith("d/"))
    assert len(pages) == 3 and store._fs is None  # 8 keys in pages of 3; no s3fs filesystem
    assert Store(f"s3://{bucket}/nothing", s3_server.options()).list() == []
    assert Store("s3://no-such-bucket-here/p", s3_server.options()).list() == []
