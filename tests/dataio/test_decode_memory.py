"""DECODE memory (issue 25 item 3): the read-ahead follows the batch, not a fixed 128 MiB; local tar
shards are read batch by batch (stream/by_sample.py) into the very batches whole windows make; a
worker decodes into the shared-memory tensor the batch travels in. No memory figure is asserted:
only the budget arithmetic and what the code reads and allocates."""

from __future__ import annotations

import shutil

import pytest
import torch

from dataio import make_loader
from dataio.errors import ShardFormatError
from dataio.loader.config import (
    DECODE_PREFETCH_BATCHES,
    DECODE_PREFETCH_FLOOR_BYTES,
    RAW_PREFETCH_BYTES,
    LoaderConfig,
    MiB,
    read_ahead_bytes,
)
from dataio.plan.types import PlanState
from dataio.readers.tar import TarReader
from dataio.loader import execution
from dataio.stream.by_sample import SampleReads
from dataio.stream.decoded import WorkerStream
from dataio.stream.job import OpenJob
from tests.dataio.loader_helpers import TOTAL, batch_summary

pytestmark = pytest.mark.timeout(120)


def test_decoding_reads_ahead_a_few_batches_not_128_mib() -> None:
    config = LoaderConfig.from_options(batch_size=256)
    jpegs = 100_000  # ImageNet-like: ~100 KB a sample
    assert read_ahead_bytes(config, decoding=True, mean_sample_bytes=jpegs) == DECODE_PREFETCH_BATCHES * 256 * jpegs
    assert DECODE_PREFETCH_BATCHES * 256 * jpegs < 64 * MiB < RAW_PREFETCH_BYTES
    assert read_ahead_bytes(config, decoding=True, mean_sample_bytes=100) == DECODE_PREFETCH_FLOOR_BYTES  # floor
    assert read_ahead_bytes(config, decoding=True, mean_sample_bytes=10**7) == RAW_PREFETCH_BYTES  # capped
    assert read_ahead_bytes(config, decoding=False, mean_sample_bytes=jpegs) == RAW_PREFETCH_BYTES  # RAW keeps it
    explicit = LoaderConfig.from_options(batch_size=256, prefetch_bytes=300 * MiB)
    assert read_ahead_bytes(explicit, decoding=True, mean_sample_bytes=jpegs) == 300 * MiB  # the user's wins
    with pytest.raises(ValueError, match="prefetch_bytes"):
        LoaderConfig.from_options(batch_size=4, prefetch_bytes=0)


def test_the_loader_gives_its_workers_the_budget_of_its_task(dataset) -> None:
    for decode, budget in (("cpu", DECODE_PREFETCH_FLOOR_BYTES), (None, RAW_PREFETCH_BYTES)):
        with make_loader(dataset, batch_size=4, image_size=8, decode=decode) as loader:
            assert loader.job.prefetch_bytes == budget  # tiny samples: the decode floor
    with make_loader(dataset, batch_size=4, image_size=8, prefetch_bytes=5 * MiB) as loader:
        assert loader.job.prefetch_bytes == 5 * MiB


def epoch_summaries(url: str, **options) -> list[tuple]:
    with make_loader(url, image_size=8, seed=3, **options) as loader:
        out = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            out.extend(batch_summary(b) for b in loader)
        return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers,batch_size,shuffle_window,tail", [
    (0, 4, 5, "pad"),  # windows of 5 and batches of 4: batches span windows
    (2, 3, 7, "drop"),  # worker processes (forked: the patch below reaches them), the main's first batch
])
def test_batch_by_batch_reads_make_the_batches_whole_windows_make(
        dataset, monkeypatch, num_workers, batch_size, shuffle_window, tail) -> None:
    options = dict(num_workers=num_workers, batch_size=batch_size, shuffle_window=shuffle_window, tail=tail,
                   multiprocessing_context="fork" if num_workers else None)
    by_batch = epoch_summaries(dataset, **options)
    kind = execution._stream_kind  # the plan's choice, made once: whole windows instead of batch by batch
    monkeypatch.setattr(execution, "_stream_kind", lambda *a: "decoded" if kind(*a) == "by_sample" else kind(*a))
    whole_windows = epoch_summaries(dataset, **options)
    assert by_batch == whole_windows  # keys, masks, labels, pixels, batch numbers, in order
    assert len(by_batch) >= 2 * (TOTAL // batch_size)


def test_local_shards_are_read_one_sample_per_read_and_only_for_batches(dataset, monkeypatch) -> None:
    sizes: list[int] = []
    read, fetch = SampleReads._read, TarReader.fetch

    def counting(self, piece, begin, into):
        sizes.append(piece.seg.stop - piece.seg.start)
        return read(self, piece, begin, into)

    def whole(self, seg):
        sizes.append(seg.stop - seg.start)
        return fetch(self, seg)

    monkeypatch.setattr(SampleReads, "_read", counting)
    monkeypatch.setattr(TarReader, "fetch", whole)  # window reads (none expected)
    with make_loader(dataset, batch_size=4, image_size=8, shuffle_window=4096, tail="pad", num_workers=0) as loader:
        delivered = sum(len(b["__key__"]) for b in loader)
    assert set(sizes) == {1}  # no window read whole
    assert len(sizes) == delivered  # each delivered sample (pads included) read once, nothing ahead unused


def test_a_worker_decodes_into_the_shared_memory_the_batch_travels_in(dataset, monkeypatch) -> None:
    with make_loader(dataset, batch_size=4, image_size=8) as loader:
        job = loader.job
    stream = WorkerStream(OpenJob(job), 0, PlanState(epoch=0))
    here = stream.batch(0)
    stream.close()
    assert not here["image"].is_shared()  # the main process (num_workers=0): the heap
    # What a DataLoader worker does (in this process, so the tensor is seen before any pickling):
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    stream = WorkerStream(OpenJob(job), 0, PlanState(epoch=0))
    batch = stream.batch(0)
    stream.close()
    assert batch["image"].is_shared()  # decoded there: sending it copies nothing
    assert torch.equal(batch["image"], here["image"])


def test_a_shard_cut_short_after_it_was_written_is_named(dataset, tmp_path) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    shard = sorted((copy / "shards").glob("*.tar"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 2048)  # tar's end blocks and the last sample's tail
    with make_loader(str(copy), batch_size=4, image_size=8, num_workers=0, tail="pad", check_shards=False) as loader:
        with pytest.raises(ShardFormatError, match=rf"{shard.name}: .*rewrite the dataset"):  # never a hang
            list(loader)
