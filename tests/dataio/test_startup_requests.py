"""Start-up against object storage: the requests before the first batch are bounded (no listing,
no per-shard fetch that grows with the dataset) and come from the first window's shards only."""

from __future__ import annotations

import dataclasses

import pytest

from dataio import make_loader
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tools.delay_proxy import DelayProxy


def _requests_before_first_batch(s3_server, num_shards: int) -> tuple[list[str], list[str], int]:
    """(request lines before the first batch, all request lines of the epoch, batches) for a
    dataset of `num_shards` shards of 6 samples read through a counting proxy."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    write_tar_dataset(Store(url, s3_server.options()), [6] * num_shards)
    with DelayProxy(s3_server.endpoint_url, delay_s=0.0) as proxy:
        options = dataclasses.replace(s3_server.options(), endpoint_url=proxy.url, hedge=None)
        # No hedging: on a loaded machine a read can look slow enough to hedge (a second GET of
        # the same object), and these tests count GETs (hedged reads have their own tests).
        # One request in flight and a 1-byte prefetch budget: nothing is fetched ahead of the
        # consumer, so the count before the first batch is exactly what that batch needs.
        with make_loader(url, batch_size=4, num_workers=0, decode=None, shuffle=False, storage=options,
                         max_in_flight=1, prefetch_bytes=1) as loader:
            batches = iter(loader)
            next(batches)
            before = list(proxy.stats.requests)
            rest = list(batches)
        return before, list(proxy.stats.requests), 1 + len(rest)


def _is_listing(line: str) -> bool:
    return "list-type" in line or "prefix=" in line or "delimiter=" in line


@pytest.mark.timeout(120)
def test_requests_before_the_first_batch_do_not_grow_with_the_dataset(s3_server) -> None:
    small, small_all, small_batches = _requests_before_first_batch(s3_server, 3)
    large, large_all, large_batches = _requests_before_first_batch(s3_server, 40)
    assert (small_batches, large_batches) == (3 * 6 // 4, 40 * 6 // 4)
    # The manifest, then the first shard's size (HEAD), its index (and checksums) and the one
    # ranged read of the first window (one batch: plan version 2), perhaps the start of the next
    # window's (its shard's HEAD and index): a few requests whatever the shard count.
    for lines in (small, large):
        assert len(lines) <= 8 and not any(_is_listing(line) for line in lines), lines
        assert sum("manifest.json" in line for line in lines) == 1
        touched = {line.split("/shards/")[1].split(".")[0] for line in lines if "/shards/" in line}
        assert touched <= {"shard-000000", "shard-000001"}, lines  # 4 samples: the first two shards at most
    # The listing that finds missing shards (check_shards) ran after the first batch, once.
    assert sum(_is_listing(line) for line in large_all) == 1
    assert sum(_is_listing(line) for line in small_all) == 1


def _epoch_requests(server, shard_sizes: list[int], **loader_kwargs) -> tuple[list[str], list[str]]:
    """(request lines, sample keys) of one epoch of a tar dataset read through a counting proxy."""
    bucket = server.new_bucket()
    url = f"s3://{bucket}/ds"
    write_tar_dataset(Store(url, server.options()), shard_sizes)
    with DelayProxy(server.endpoint_url, delay_s=0.0) as proxy:
        options = dataclasses.replace(server.options(), endpoint_url=proxy.url, hedge=None)  # as above
        with make_loader(url, batch_size=4, decode=None, tail="pad", storage=options, check_shards=False,
                         **loader_kwargs) as loader:
            keys = [k for b in loader for k, keep in zip(b["__key__"], b["mask"].tolist()) if keep]
        return list(proxy.stats.requests), keys


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_shard_an_epoch_sends_no_head_and_its_index_and_sidecar_once_per_reader(moto_s3, num_workers) -> None:
    # On S3 every ranged GET states the object's size (Content-Range), which checks the shard's
    # size against the manifest: no HEAD. Index and checksum sidecar: one GET each per reader
    # that reads the shard (reader threads have a reader each), side by side.
    sizes = [6, 5, 7, 6]
    lines, keys = _epoch_requests(moto_s3, sizes, num_workers=num_workers)
    assert len(keys) == len(set(keys)) == sum(sizes)  # every sample once
    for s in range(len(sizes)):
        shard = f"/shards/shard-{s:06d}"
        mine = [line for line in lines if shard in line.split(" ")[1]]
        assert not [line for line in mine if line.startswith("HEAD ")], mine
        ends = [line.split(" ")[1].split(shard, 1)[1].split("?")[0] for line in mine]
        readers = max(1, num_workers)
        assert 1 <= ends.count(".tar.idx") <= readers and ends.count(".sums") == ends.count(".tar.idx"), mine
        assert ends.count(".tar") >= 1  # the shard's own ranged reads
