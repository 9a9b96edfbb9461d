"""The storage guarantees on each object store: S3 (SeaweedFS), GCS (fake-gcs-server), Azure Blob (Azurite).

The same behaviour, one case per store (`cloud` fixture): writes confirmed or failing naming the URL
under refused uploads, written exactly once under injected 503s, reads whole through resets and
truncated bodies, a stuck endpoint failing in bounded time, the writer's lease, credentials never in
a message, and the loader's start-up without a listing. A fault proxy (tools/delay_proxy) sits in
front of each server.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from dataio import make_loader
from dataio.errors import StorageError
from dataio.storage.retry import RetryPolicy
from tests.clouds import Cloud
from tests.dataio.shardgen import write_tar_dataset
from tools.delay_proxy import DelayProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)
PATIENT = RetryPolicy(max_attempts=12, base_delay_s=0.0, max_delay_s=0.0)
UPLOADS = ("PUT", "POST")  # S3 and Azure upload with PUT, GCS with POST


def test_round_trip_ranged_reads_listing_and_sizes(cloud: Cloud) -> None:
    store = cloud.store(cloud.new_url())
    data = bytes(range(256)) * 40
    store.write_bytes("d/obj.bin", data)
    assert store.read("d/obj.bin") == data
    assert store.read("d/obj.bin", 100, 1100) == data[100:1100]
    assert store.size("d/obj.bin") == len(data)
    assert store.list() == ["d/obj.bin"]


def test_refused_uploads_fail_naming_the_url_and_publish_nothing(cloud: Cloud) -> None:
    url = cloud.new_url()
    with DelayProxy(cloud.endpoint_url, 0.0, error_rate=1.0, methods=UPLOADS) as proxy:
        store = cloud.store(url, proxy.url, retry=FAST)
        began = time.monotonic()
        with pytest.raises(StorageError, match=rf"uploading {url}/obj\.bin .*gave up after 3 attempts"):
            store.write_bytes("obj.bin", b"x" * 3000)
        assert time.monotonic() - began < 30  # the SDKs' own retries are off: three tries, no minutes
        assert proxy.stats.num_errors >= 3
    assert cloud.store(url).list() == []


def test_refused_with_403_is_not_retried(cloud: Cloud) -> None:
    url = cloud.new_url()
    with DelayProxy(cloud.endpoint_url, 0.0, error_rate=1.0, error_status=403, methods=UPLOADS) as proxy:
        with pytest.raises(StorageError, match=rf"{url}/obj\.bin"):
            cloud.store(url, proxy.url, retry=FAST).write_bytes("obj.bin", b"x" * 3000)
        assert proxy.stats.num_errors == 1  # a refusal is final: sent once


def test_writes_under_503s_land_exactly_once_and_whole(cloud: Cloud) -> None:
    url = cloud.new_url()
    with DelayProxy(cloud.endpoint_url, 0.0, error_rate=0.5, methods=UPLOADS, seed=3) as proxy:
        store = cloud.store(url, proxy.url, retry=PATIENT)
        for i in range(6):
            store.write_bytes(f"o{i}.bin", bytes([i]) * (1000 + i))
        assert proxy.stats.num_errors > 0
    direct = cloud.store(url)
    assert direct.list() == [f"o{i}.bin" for i in range(6)]
    assert [direct.read(f"o{i}.bin") for i in range(6)] == [bytes([i]) * (1000 + i) for i in range(6)]


@pytest.mark.parametrize("fault", ["reset_rate", "truncate_rate"])
def test_reads_come_back_whole_through_resets_and_truncated_bodies(cloud: Cloud, fault: str) -> None:
    url = cloud.new_url()
    data = bytes(range(256)) * 400
    cloud.store(url).write_bytes("obj.bin", data)
    with DelayProxy(cloud.endpoint_url, 0.0, methods=("GET",), seed=5, **{fault: 0.5}) as proxy:
        store = cloud.store(url, proxy.url, retry=PATIENT)
        got = [store.read("obj.bin", i * 10_000, (i + 1) * 10_000) for i in range(8)]
        assert got == [data[i * 10_000:(i + 1) * 10_000] for i in range(8)]
        assert store.read("obj.bin", expect_size=len(data)) == data
        assert proxy.stats.num_resets + proxy.stats.num_truncated > 0


def test_a_stuck_endpoint_fails_in_bounded_time(cloud: Cloud) -> None:
    url = cloud.new_url()
    cloud.store(url).write_bytes("obj.bin", b"z" * 5000)
    with DelayProxy(cloud.endpoint_url, 0.0, hang_rate=1.0, methods=("GET",)) as proxy:
        options = replace(cloud.options(proxy.url), connect_timeout_s=1.0, read_timeout_s=1.0, hedge=None)
        store = type(cloud.store(url))(url, options, RetryPolicy(deadline_s=3.0, base_delay_s=0.0, max_delay_s=0.0))
        began = time.monotonic()
        with pytest.raises(StorageError, match=rf"reading {url}/obj\.bin"):
            store.read("obj.bin", 0, 100)
        # The budget (3 s), plus one try's read timeout in flight when it ran out, plus >= 5 s slack.
        assert time.monotonic() - began < 3.0 + 2 * 1.0 + 5.0 + 5.0
        assert proxy.stats.num_hangs >= 1


def test_lease_creates_race_to_one_winner(cloud: Cloud) -> None:
    store = cloud.store(cloud.new_url())
    if not store.exclusive_is_atomic:
        pytest.skip(f"{cloud.kind}: conditional creates are not atomic here (read, then write)")
    wins: list[bool] = []
    threads = [threading.Thread(target=lambda i=i: wins.append(store.create_exclusive("lease.json", b"%d" % i)))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 5 + [True]
    data, tag = store.read_tagged("lease.json")  # type: ignore[misc]
    assert store.replace_if("lease.json", b"next", tag) is not None
    assert store.replace_if("lease.json", b"stale", tag) is None  # the tag changed: the old holder lost
    assert store.read("lease.json") == b"next"


def test_credentials_never_appear_in_errors(cloud: Cloud) -> None:
    url = cloud.new_url()
    with DelayProxy(cloud.endpoint_url, 0.0, error_rate=1.0, error_status=403, methods=("GET",)) as proxy:
        with pytest.raises(StorageError) as info:
            cloud.store(url, proxy.url, retry=FAST).read("missing.bin", 0, 10)
    text = str(info.value) + repr(info.value.__cause__)
    for secret in cloud.secrets:
        if len(secret) >= 4 and secret not in ("anon",):
            assert secret not in text


def test_loader_start_up_lists_nothing(cloud: Cloud) -> None:
    url = cloud.new_url("ds")
    write_tar_dataset(cloud.store(url), [6] * 12)
    with DelayProxy(cloud.endpoint_url, delay_s=0.0) as proxy:
        options = replace(cloud.options(proxy.url), hedge=None)
        with make_loader(url, batch_size=4, num_workers=0, decode=None, shuffle=False, storage=options,
                         max_in_flight=1, prefetch_bytes=1) as loader:
            batches = iter(loader)
            next(batches)
            before = list(proxy.stats.requests)
            assert 1 + sum(1 for _ in batches) == 12 * 6 // 4
    listings = [line for line in before if "list-type" in line or "prefix=" in line or "comp=list" in line]
    assert not listings and len(before) <= 10, before
    assert sum("manifest.json" in line for line in before) == 1


def test_abfs_reads_what_az_wrote_over_the_blob_endpoint(azure_server) -> None:
    from dataio.storage.store import Store

    bucket = azure_server.new_bucket()
    Store(f"az://{bucket}/p", azure_server.options()).write_bytes("obj.bin", b"same blob")
    abfs = Store(f"abfs://{bucket}/p", azure_server.options())
    assert abfs.read("obj.bin", 5, 9) == b"blob" and abfs.list() == ["obj.bin"]
    assert abfs.exclusive_is_atomic and not abfs.create_exclusive("obj.bin", b"other")


def test_gc_discards_uncommitted_blocks_of_cut_off_uploads_only(azure_server) -> None:
    from dataio.storage.azure import client_for
    from dataio.storage.store import Store

    bucket = azure_server.new_bucket()
    store = Store(f"az://{bucket}/p", azure_server.options())
    store.write_bytes("done.bin", b"kept")
    container = client_for(azure_server.options()).get_container_client(bucket)
    container.get_blob_client("p/cut.bin").stage_block("YmxvY2sx", b"x" * 100)  # an upload cut off
    container.get_blob_client("p/done.bin").stage_block("YmxvY2sx", b"y" * 10)  # a retry of a committed blob
    assert store.abort_uploads(3600.0) == []  # younger than the grace period
    assert store.abort_uploads(0.0) == ["cut.bin"]
    names = [b.name for b in container.list_blobs(name_starts_with="p/", include=["uncommittedblobs"])]
    assert names == ["p/done.bin"] and store.read("done.bin") == b"kept"


def test_disk_cache_serves_a_second_epoch_without_the_store(cloud: Cloud, tmp_path) -> None:
    url = cloud.new_url("ds")
    write_tar_dataset(cloud.store(url), [6] * 4)
    with DelayProxy(cloud.endpoint_url, delay_s=0.0) as proxy:
        options = replace(cloud.options(proxy.url), hedge=None)

        def epoch() -> int:
            with make_loader(url, batch_size=4, num_workers=0, decode=None, shuffle=False, storage=options,
                             cache_dir=str(tmp_path / "cache"), cache_limit_bytes=64 << 20) as loader:
                return sum(1 for _ in loader)

        first = epoch()
        shard_reads = sum(map(_reads_shard_bytes, proxy.stats.requests))
        assert epoch() == first == 6
        again = sum(map(_reads_shard_bytes, proxy.stats.requests)) - shard_reads
        assert shard_reads > 0 and again == 0, proxy.stats.requests[-10:]  # (a size check per shard remains)


def _reads_shard_bytes(line: str) -> bool:
    """A GET of a tar shard's bytes (not its index or sidecar; on GCS not its metadata)."""
    path = line.split(" ")[1]
    return (line.startswith("GET") and ".tar" in path and ".tar." not in path and "%2Etar." not in path
            and ("/storage/v1/" not in path or "alt=media" in path))
