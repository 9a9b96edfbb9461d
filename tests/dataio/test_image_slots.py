"""Decoded images on worker storages the main process releases (dataio/stream/image_slots.py):
a storage is written again only once nothing in the main process refers to it, so kept batches,
views and numpy arrays of them stay intact, and dropped batches' storages are reused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataio import make_loader
from dataio.stream.image_slots import _MAGIC, POOLED_SLOTS, SharedSlots, SlotReleaser, _tail
from tests.dataio.loader_helpers import TOTAL

pytestmark = pytest.mark.timeout(300)
OPTIONS = dict(decode="cpu", image_size=16, seed=3, tail="pad", batch_size=2, shuffle_window=4,
               rank=0, world_size=1)


def _epochs(url: str, epochs: int, **options) -> list[list[torch.Tensor]]:
    """Every batch's images, cloned as they arrive (the reference)."""
    with make_loader(url, **{**OPTIONS, **options}) as loader:
        out = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            out.append([b["image"].clone() for b in loader])
    return out


def test_kept_batches_views_and_arrays_are_never_overwritten(dataset):
    """Processes: keep every batch of epoch 0, a view of one and a numpy array of another from
    epoch 1 while the rest are dropped; all equal the reference (reader threads: the same batches,
    from this process's StoragePool) after two epochs."""
    reference = _epochs(dataset, 2, num_workers=2, worker_mode="threads")
    with make_loader(dataset, num_workers=2, worker_mode="processes", multiprocessing_context="fork",
                     **OPTIONS) as loader:
        kept = list(loader)
        loader.set_epoch(1)
        held_view = held_array = None
        for number, batch in enumerate(loader):
            if number == 1:
                held_view = batch["image"][1]  # a view keeps the storage
            if number == 2:
                held_array = batch["image"].numpy()
        assert len(kept) == len(reference[0]) > 4
        for batch, expected in zip(kept, reference[0]):
            assert torch.equal(batch["image"], expected)
        assert torch.equal(held_view, reference[1][1][1])
        assert np.array_equal(held_array, reference[1][2].numpy())


def test_dropped_batches_storages_are_reused(dataset):
    """Batches dropped as the loop moves on come on a few pooled storages (POOLED_SLOTS per worker),
    mapped once in this process; what the caller dropped is released as it asks for the next batch."""
    with make_loader(dataset, num_workers=2, worker_mode="processes", multiprocessing_context="fork",
                     **OPTIONS) as loader:
        releases = []
        release_unused = loader._slot_releaser.release_unused
        loader._slot_releaser.release_unused = lambda: releases.append(loader._delivered) or release_unused()
        pooled, count = [], 0
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                if _tail(batch["image"].untyped_storage())[0] == _MAGIC:
                    pooled.append(batch["image"].untyped_storage().data_ptr())
                count += 1
                done = loader._delivered
                if done > 1:  # as the caller asked for this batch (its last one held), then on delivery
                    assert releases[-3:] == [done - 1, done - 1, done]
    assert count >= 2 * TOTAL // OPTIONS["batch_size"] - 2
    assert len(set(pooled)) <= 2 * POOLED_SLOTS < len(pooled)  # reused; a worker running ahead takes fresh ones


def test_a_slot_is_free_only_once_released():
    """Unit: the worker reuses a storage only after the releaser saw nothing else refer to it."""
    slots, releaser = SharedSlots(max_slots=2), SlotReleaser(max_storages=8)
    first = slots.allocate(1000)
    releaser.keep({"image": first})
    assert releaser.release_unused() == 0  # `first` still refers to it
    second = slots.allocate(1000)
    assert second.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
    ptr = first.untyped_storage().data_ptr()
    del first
    assert releaser.release_unused() == 1
    third = slots.allocate(900)  # fits in the released one
    assert third.untyped_storage().data_ptr() == ptr
    fourth = slots.allocate(1000)  # two slots busy, the limit reached: a fresh storage nobody pools
    releaser.keep({"image": fourth})
    assert slots.num_slots == 2 and len(releaser._storages) == 1
    del second, third, fourth


def test_a_refilled_slot_in_the_queue_is_not_released():
    """Unit: the releaser releases up to the batch it received. A storage the worker filled again
    after a release travels to this process while nothing here refers to it: still busy."""
    slots, releaser = SharedSlots(max_slots=4), SlotReleaser(max_storages=8)
    batch = slots.allocate(512)
    ptr = batch.untyped_storage().data_ptr()
    releaser.keep({"image": batch})
    del batch
    assert releaser.release_unused() == 1
    refilled = slots.allocate(512)  # the worker reuses it: this batch is "in the queue"
    assert refilled.untyped_storage().data_ptr() == ptr
    del refilled  # the worker's own reference goes once the batch is sent
    assert releaser.release_unused() == 0  # nothing here refers to it, but its batch never arrived
    other = slots.allocate(512)
    assert other.untyped_storage().data_ptr() != ptr  # so the worker does not write it again


def test_a_forked_child_starts_with_empty_pools():
    """A fork while a thread holds the StoragePool's lock (a read thread allocating) must not hand
    the child a held lock: the child's pools are its own (seen: a worker hung in allocate)."""
    import os
    import threading

    from dataio.stream import image_slots, slabs

    slabs.recycled_uint8(4096)
    image_slots.shared_slots().allocate(128)
    release, holding = threading.Event(), threading.Event()

    def hold() -> None:
        with slabs._POOL._lock:
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: allocating must not wait for the parent's thread (killed if it does)
        import signal

        signal.alarm(10)
        ok = slabs._POOL.num_storages == 0 and image_slots._SLOTS is None
        slabs.recycled_uint8(4096)
        os._exit(0 if ok else 1)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_pooled_buffers_false_gives_fresh_memory_and_the_same_batches(dataset):
    """pooled_buffers=False: every batch on a fresh storage (the memory goes as batches are dropped),
    and the same pixels; a non-bool is refused."""
    options = dict(num_workers=2, worker_mode="processes", multiprocessing_context="fork")
    pooled = _epochs(dataset, 1, **options)
    with make_loader(dataset, pooled_buffers=False, **options, **OPTIONS) as loader:
        assert not loader.job.pooled_images and not loader.job.pooled_reads
        fresh = [b["image"].clone() for b in loader]
        assert loader._slot_releaser is None
    assert len(fresh) == len(pooled[0]) and all(torch.equal(a, b) for a, b in zip(fresh, pooled[0]))
    with pytest.raises(TypeError, match="pooled_buffers"):
        make_loader(dataset, pooled_buffers="yes", **OPTIONS)
