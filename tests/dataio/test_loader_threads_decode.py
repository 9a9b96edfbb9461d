"""decode="cpu" in reader threads (worker_mode "threads"): what worker processes deliver, bit for bit.

Thread i runs the stream DataLoader worker i would run, so the decoded pixels, keys, order, state
and a resume at another topology are those of worker processes; the images come from the
process's StoragePool, so kept batches are never overwritten and dropped ones are reused; a corrupt
JPEG raises naming its shard and key, or is substituted as in processes.
"""

from __future__ import annotations

import time

import pytest
import torch

from dataio import make_loader
from dataio.errors import CorruptSampleError
from dataio.stream.slabs import MIN_SLAB_BYTES
from tests.dataio.loader_helpers import TOTAL, batch_summary, summary_keys
from tests.dataio.test_loader_threads import reader_threads, resumed_run

pytestmark = pytest.mark.timeout(300)
DECODE = dict(decode="cpu", image_size=16, seed=5, tail="pad")


def summaries(url: str, epochs: int = 2, **options) -> list[list[tuple]]:
    """Per epoch, batch_summary of every batch (pixels included), each read as it arrives."""
    out = []
    with make_loader(url, rank=0, world_size=1, **{**DECODE, **options}) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([batch_summary(b) for b in loader])
    return out


@pytest.mark.parametrize("options", [
    dict(batch_size=4, shuffle_window=6, num_workers=2),  # processes: the first batch made in main
    dict(batch_size=3, shuffle_window=5, num_workers=3, reuse_buffers=True, train=False),
    dict(batch_size=4, num_workers=2, transform=lambda image: 255 - image),  # a hook runs in the threads too
])
def test_decoding_threads_deliver_what_worker_processes_deliver(dataset, options):
    threads = summaries(dataset, worker_mode="threads", **options)
    processes = summaries(dataset, worker_mode="processes", multiprocessing_context="fork", **options)
    assert threads == processes
    assert sorted(k for b in threads[0] for k in summary_keys(b)) == sorted(f"{i:06d}" for i in range(TOTAL))
    assert not reader_threads()


def test_a_decoding_resume_at_another_topology_is_the_same_in_threads_and_processes(dataset):
    threads = resumed_run(dataset, "threads", DECODE)
    assert sorted(threads[0]) == sorted(f"{i:06d}" for i in range(TOTAL))
    assert threads == resumed_run(dataset, "processes", DECODE)


def test_kept_batches_stay_intact_and_dropped_ones_are_reused(dataset):
    """The images come from the StoragePool: list(loader) keeps every batch as it was delivered,
    and a loop that drops each batch gets its image buffer back (no fresh pages per batch)."""
    options = dict(batch_size=2, num_workers=2, worker_mode="threads")
    expected = summaries(dataset, epochs=1, **options)[0]
    with make_loader(dataset, rank=0, world_size=1, **DECODE, **options) as loader:
        assert [batch_summary(b) for b in list(loader)] == expected
        loader.set_epoch(0)
        buffers = set()
        for batch in loader:
            storage = batch["image"].untyped_storage()
            assert storage.nbytes() >= MIN_SLAB_BYTES  # a pooled storage, not the decoder's own array
            buffers.add(storage.data_ptr())
            del batch, storage
    assert len(buffers) < len(expected)  # reused: the threads hold a few batches ahead, not all


def test_a_corrupt_jpeg_in_a_thread_raises_naming_shard_and_key(corrupt_dataset):
    url, bad_key = corrupt_dataset
    with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, worker_mode="threads",
                     **DECODE) as loader:
        with pytest.raises(CorruptSampleError, match=f"shard-000001.tar.*{bad_key}.*on_corrupt='skip'"):
            list(loader)
    assert not reader_threads()


def test_a_corrupt_jpeg_is_substituted_as_in_processes(corrupt_dataset):
    url, bad_key = corrupt_dataset
    runs, skipped = [], []
    for mode in ("threads", "processes"):
        with make_loader(url, rank=0, world_size=1, batch_size=4, num_workers=2, worker_mode=mode,
                         on_corrupt="skip", multiprocessing_context="fork", **DECODE) as loader:
            runs.append([batch_summary(b) for b in loader])
            skipped.append(loader.stats.corrupt_keys)
    assert runs[0] == runs[1]
    assert skipped[0] == skipped[1] and skipped[0][0].endswith(f"shard-000001.tar#{bad_key}")


def test_threads_refuse_dali_and_accept_cpu_decode():
    from dataio import LoaderConfig

    LoaderConfig.from_options(batch_size=4, decode="cpu", worker_mode="threads")
    with pytest.raises(ValueError, match="decode='dali'.*worker_mode='processes'"):
        LoaderConfig.from_options(batch_size=4, decode="dali", worker_mode="threads")


@pytest.mark.parametrize("num_workers,mode,context", [
    (0, "processes", None), (2, "processes", "fork"), (2, "threads", None),
    pytest.param(1, "processes", "spawn", marks=pytest.mark.slow),  # one: a spawned worker imports torch, seconds
])
def test_decoded_images_on_reused_slabs_are_the_fresh_ones(dataset, num_workers, mode, context):
    """reuse_buffers=True: the images too are decoded into the worker's reused slabs (shared memory
    with processes), read as each batch arrives: the same pixels as fresh tensors."""
    options = dict(batch_size=3, shuffle_window=5, num_workers=num_workers, worker_mode=mode)
    # The fresh reference: forked workers give the same batches as spawned ones (the same plan), for a
    # fraction of the cost (a spawned worker imports torch again: seconds).
    fresh = "fork" if context == "spawn" else context
    assert summaries(dataset, reuse_buffers=True, multiprocessing_context=context, **options) == summaries(
        dataset, multiprocessing_context=fresh, **options)


def test_a_slab_image_is_kept_while_the_caller_holds_the_batch(dataset):
    options = dict(batch_size=2, num_workers=2, worker_mode="processes", multiprocessing_context="fork",
                   prefetch_factor=1)
    expected = summaries(dataset, epochs=1, **options)[0]
    with make_loader(dataset, rank=0, world_size=1, reuse_buffers=True, **DECODE, **options) as loader:
        got = []
        for batch in loader:
            before = batch["image"].clone()
            time.sleep(0.02)  # the workers run ahead meanwhile
            assert torch.equal(batch["image"], before)
            got.append(batch_summary(batch))
        kept = loader._slab_keeper._storages  # the slabs this process keeps mapped (slabs.py SlabKeeper)
        assert 0 < len(kept) < len(got)  # the images came on a few reused slabs, not a fresh one each
    assert got == expected
