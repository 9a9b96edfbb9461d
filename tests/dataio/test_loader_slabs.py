"""reuse_buffers=True: RAW batches packed into reused slabs deliver the same bytes as fresh
tensors, read as each batch arrives; the ring stays small; a slab is rewritten only once the
caller has moved past the batch that used it."""

from __future__ import annotations

import hashlib

import pytest

from dataio import make_loader
from dataio.stream.slabs import MAX_SLABS, SlabRing
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset

SIZES = [40, 3, 57, 0, 29, 64]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("slabs") / "ds")
    write_tar_dataset(Store(root), SIZES, real_images=True)
    return root


def digests(url: str, epochs: int = 2, **options) -> list[list[tuple[str, str]]]:
    """Per epoch, (key, sha1 of the image bytes) of every real sample, read as its batch arrives."""
    out = []
    with make_loader(url, batch_size=8, decode=None, seed=3, rank=0, world_size=1, tail="pad", **options) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            seen = []
            for batch in loader:
                packed = batch["jpg"]
                data = packed.data.numpy()
                offsets = packed.offsets.tolist()
                for i, (key, real) in enumerate(zip(batch["__key__"], batch["mask"].tolist())):
                    if real:
                        seen.append((key, hashlib.sha1(data[offsets[i]:offsets[i + 1]]).hexdigest()))
            out.append(seen)
    return out


@pytest.mark.parametrize("num_workers,context", [
    # spawn: one worker (each spawned one imports torch again: seconds); fork and threads deal to two
    (0, None), (2, "fork"), pytest.param(1, "spawn", marks=pytest.mark.slow), (2, "threads"),
])
def test_reused_slabs_deliver_the_same_bytes(dataset, num_workers, context):
    options: dict = {"num_workers": num_workers}
    if context == "threads":
        options["worker_mode"] = "threads"
    elif context is not None:
        options |= {"multiprocessing_context": context, "worker_mode": "processes"}
    # The fresh reference through forked workers where the case spawns: the same batches (the same plan)
    # for a fraction of the cost (a spawned worker imports torch again: seconds).
    fresh = digests(dataset, **{**options, "multiprocessing_context": "fork"} if context == "spawn" else options)
    reused = digests(dataset, reuse_buffers=True, **options)
    assert reused == fresh
    assert len({k for k, _ in fresh[0]}) == sum(SIZES)


def test_in_process_ring_stays_small(dataset):
    with make_loader(dataset, batch_size=8, decode=None, num_workers=0, rank=0, world_size=1,
                     reuse_buffers=True) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        ring = loader._dataloader.dataset._slabs
        assert ring is not None and ring.num_slabs <= 3  # one in the caller's hands, one being filled


def test_a_slab_is_rewritten_only_after_the_caller_moved_past_its_batch():
    ring = SlabRing(shared=False)
    with ring.serving(token=1, batch_index=0, released_below=0):
        first = ring.allocate(1000)
    with ring.serving(token=1, batch_index=1, released_below=0):  # batch 0 still held
        second = ring.allocate(1000)
    assert first.data_ptr() != second.data_ptr()
    with ring.serving(token=1, batch_index=2, released_below=1):  # the caller moved past batch 0
        third = ring.allocate(900)
    assert third.data_ptr() == first.data_ptr()
    with ring.serving(token=2, batch_index=0, released_below=0):  # a new iteration frees the old
        assert ring.allocate(10).data_ptr() in (first.data_ptr(), second.data_ptr())


def test_a_caller_holding_every_batch_gets_fresh_tensors_past_the_cap():
    ring = SlabRing(shared=False)
    ptrs = set()
    for k in range(MAX_SLABS + 5):
        with ring.serving(token=1, batch_index=k, released_below=0):
            ptrs.add(ring.allocate(100).data_ptr())
    assert ring.num_slabs == MAX_SLABS and len(ptrs) == MAX_SLABS + 5


def test_reuse_buffers_is_refused_with_dali():
    from dataio import LoaderConfig

    with pytest.raises(ValueError, match="reuse_buffers"):
        LoaderConfig.from_options(batch_size=4, decode="dali", reuse_buffers=True)
    with pytest.raises(TypeError):
        LoaderConfig.from_options(batch_size=4, reuse_buffers=1)


def test_the_main_process_keeps_only_slab_storages_and_a_bounded_number():
    import torch

    from dataio.batch import PackedBytes
    from dataio.stream.slabs import SlabKeeper

    keeper = SlabKeeper(max_storages=3)
    for _ in range(5):
        keeper.keep({"jpg": PackedBytes.pack([b"abc", b"de"]), "image": torch.zeros(2, 3, 4, 4, dtype=torch.uint8),
                     "label": torch.zeros(2, dtype=torch.int64)})
    assert len(keeper._storages) == 3  # images and labels are never held; old slabs age out


def test_the_storage_pool_never_hands_out_what_someone_still_holds():
    import numpy as np

    from dataio.stream.slabs import StoragePool

    pool = StoragePool(max_storages=4)
    held = pool.allocate(1000)
    view, array = held[10:20], held.numpy()
    ptr = held.data_ptr()
    del held
    assert pool.allocate(1000).data_ptr() != ptr  # a view and a numpy array still hold it
    del view
    assert pool.allocate(1000).data_ptr() != ptr
    del array
    again = pool.allocate(900)  # nobody holds it now: reused, its pages already there
    assert again.data_ptr() == ptr
    kept = [pool.allocate(100) for _ in range(6)]  # past the cap: fresh tensors, none shared
    assert len({t.data_ptr() for t in [again, *kept]}) == 7 and np.all([t.numel() == 100 for t in kept])
    del kept
    pool.release()  # what nobody holds goes; `again` is still held
    assert pool.num_storages == 1 and pool.allocate(10).data_ptr() != again.data_ptr()


def test_huge_pages_keeps_the_storage_as_it_is():
    import torch

    from dataio.stream.slabs import huge_pages

    for num_bytes in (100, 9 << 20):  # below and above the huge-page size
        storage = torch.UntypedStorage(num_bytes)
        assert huge_pages(storage) is storage and storage.nbytes() == num_bytes
        t = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (num_bytes,))
        t.fill_(7)
        assert int(t.sum()) == 7 * num_bytes
