"""Reusable buffers for batches (`reuse_buffers=True`): a ring of slabs per worker.

Why: a fresh shared-memory tensor per RAW batch costs more than copying the bytes into it. Each
new segment is created, mapped, and every one of its pages faults in when first written (and
again in the main process); on a 2-core machine a 26 MB batch took ~150 ms that way and ~30 ms
into a slab written before. So each worker (or the main process, with num_workers=0) keeps
slabs and packs every batch's bytes into one it has used before; torch sends an already shared
storage as a handle, and the main process keeps the slabs it has seen mapped (torch's own cache
of shared storages hits while a reference lives), so nothing is mapped per batch.

Decoded images (decode="cpu") go on the same slabs: a fresh 38.5 MB shared batch of 256 images
costs ~85 us of page faults per image, a slab written before a few us.

Lifetime: a batch's PackedBytes (and images) are views of a slab. They stay valid until the
caller asks for the next batch (the loop moves on); after that the worker may write another
batch there. Each ticket the main process sends carries `released_below`: the number of batches of the iteration
the caller has moved past. A slab is rewritten only once the batch that filled it is below that
mark (or belongs to an earlier iteration), so nothing still in the DataLoader's queues, its
reordering buffer or the caller's hands is ever overwritten. Keep a batch's bytes beyond that
with `.clone()` (or leave `reuse_buffers=False`, the default: fresh tensors per batch).
`pin_memory=True` pins the tensors torch knows how to pin (labels, mask, images: pinned copies,
independent of the slab); PackedBytes fields stay in their slab and follow the rule above.
Reader threads (threads.py) keep one ring per thread, in ordinary memory, under the same rule.

Without reuse_buffers, batches built in the caller's process (reader threads, num_workers=0)
still avoid fresh pages: StoragePool reuses a storage only once nothing but the pool refers to
it, so those batches may be kept for as long as the caller likes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from dataio.batch import PackedBytes

MIN_SLAB_BYTES = 1 << 20
GROWTH = 1.25  # a new slab has room for batches a quarter larger than the one that asked
MAX_SLABS = 32  # per ring: beyond this (callers holding many batches), fresh tensors are used
_local = threading.local()


@dataclass
class _Slab:
    storage: torch.UntypedStorage
    token: int = -1  # the iteration and batch that last filled it
    batch_index: int = -1


class SlabRing:
    """One process's slabs; `serving` marks which batch allocations belong to and what is free."""

    def __init__(self, *, shared: bool) -> None:
        self.shared = shared
        self._slabs: list[_Slab] = []
        self._token, self._batch_index, self._released_below = -1, -1, 0

    @contextlib.contextmanager
    def serving(self, token: int, batch_index: int, released_below: int) -> Iterator[None]:
        """Allocations inside belong to batch `batch_index` of iteration `token`; batches of that
        iteration below `released_below`, and every earlier iteration's, may be overwritten."""
        if token == self._token:  # tickets may arrive out of order: the mark only rises
            released_below = max(released_below, self._released_below)
        self._token, self._batch_index, self._released_below = token, batch_index, released_below
        _local.ring = self
        try:
            yield
        finally:
            _local.ring = None

    def _free(self, slab: _Slab) -> bool:
        return slab.token != self._token or slab.batch_index < self._released_below

    def allocate(self, num_bytes: int) -> torch.Tensor:
        """A uint8 tensor of `num_bytes` on a free slab (contents undefined)."""
        fits = [s for s in self._slabs if self._free(s) and s.storage.nbytes() >= num_bytes]
        if fits:
            slab = min(fits, key=lambda s: s.storage.nbytes())
        else:
            free = [s for s in self._slabs if self._free(s)]
            if free:  # too small: replace the smallest free slab by a larger one
                self._slabs.remove(min(free, key=lambda s: s.storage.nbytes()))
            elif len(self._slabs) >= MAX_SLABS:
                return fresh_uint8(num_bytes, self.shared)
            slab = _Slab(_new_storage(max(MIN_SLAB_BYTES, int(num_bytes * GROWTH)), self.shared))
            self._slabs.append(slab)
        slab.token, slab.batch_index = self._token, self._batch_index
        return torch.empty(0, dtype=torch.uint8).set_(slab.storage, 0, (num_bytes,))

    @property
    def num_slabs(self) -> int:
        return len(self._slabs)


def active_ring() -> SlabRing | None:
    """The ring serving the batch being assembled in this thread, if buffers are reused."""
    return getattr(_local, "ring", None)


def _new_storage(num_bytes: int, shared: bool) -> torch.UntypedStorage:
    if shared:
        return torch.UntypedStorage._new_shared(num_bytes)
    return huge_pages(torch.UntypedStorage(num_bytes))


_HUGE_PAGE = 2 << 20
_madvise: Any = None


def huge_pages(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """Ask for transparent huge pages on a fresh, not yet written, long-lived storage of at least a
    few MB (a pooled batch buffer): its first writes then fault ~15 times for 27 MB instead of ~7,000
    (4 ms instead of 16 here). Linux with THP in "madvise" or "always" mode; elsewhere nothing."""
    global _madvise
    if storage.nbytes() < 2 * _HUGE_PAGE or not sys.platform.startswith("linux"):
        return storage
    if _madvise is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    if _madvise:
        start = storage.data_ptr()
        first = -(-start // _HUGE_PAGE) * _HUGE_PAGE  # whole huge pages inside the storage only
        last = (start + storage.nbytes()) // _HUGE_PAGE * _HUGE_PAGE
        if last > first:
            _madvise(first, last - first, 14)  # MADV_HUGEPAGE; a refusal (EINVAL: no THP) changes nothing
    return storage


def fresh_uint8(num_bytes: int, shared: bool) -> torch.Tensor:
    """A new uint8 tensor of num_bytes (in shared memory if `shared`), pooled by nobody."""
    return torch.empty(0, dtype=torch.uint8).set_(_new_storage(num_bytes, shared)) if shared else torch.empty(
        num_bytes, dtype=torch.uint8)


class StoragePool:
    """Fresh-looking tensors without fresh pages: reuse a storage once nobody but the pool holds it.

    For batches built in the caller's process (reader threads, num_workers=0) with
    reuse_buffers=False: a new 26 MB tensor per batch costs its page faults, more than the copy
    into it. The pool keeps the storages it handed out and reuses one only when its use count
    says the pool's reference is the last (the caller dropped the batch and every view and numpy
    array of it): the caller may keep any batch as long as it likes, nothing it holds is ever
    written again. Without torch's (private) use count it hands out fresh tensors.
    """

    def __init__(self, max_storages: int = 16) -> None:
        self.max_storages = max_storages
        self._storages: list[torch.UntypedStorage] = []
        self._lock = threading.Lock()

    def allocate(self, num_bytes: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of num_bytes, on a storage nobody else holds."""
        if _use_count is None:
            return torch.empty(num_bytes, dtype=torch.uint8)
        with self._lock:
            free = [i for i, s in enumerate(self._storages) if _use_count(s._cdata) == 1]
            fits = [i for i in free if self._storages[i].nbytes() >= num_bytes]
            if fits:
                storage = self._storages[min(fits, key=lambda i: self._storages[i].nbytes())]
            else:
                if free:  # too small: a larger one takes the smallest free one's place
                    self._storages.pop(min(free, key=lambda i: self._storages[i].nbytes()))
                storage = huge_pages(torch.UntypedStorage(max(MIN_SLAB_BYTES, int(num_bytes * GROWTH))))
                if len(self._storages) < self.max_storages:
                    self._storages.append(storage)
            # Under the lock: the tensor's reference marks the storage taken for the other threads.
            return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (num_bytes,))


    def release(self) -> None:
        """Let go of the storages nobody else holds (their memory goes back); the rest stay the caller's."""
        with self._lock:
            self._storages = [s for s in self._storages if _use_count is None or _use_count(s._cdata) > 1]

    @property
    def num_storages(self) -> int:
        return len(self._storages)


_use_count = getattr(torch._C, "_storage_Use_Count", None)
_POOL = StoragePool()


def _pool_in_child() -> None:
    """A forked child (a DataLoader worker) starts with a pool of its own: the parent's lock may
    have been held by one of its threads at the fork (a read thread allocating), and the parent's
    storages are the parent's."""
    global _POOL
    _POOL = StoragePool(_POOL.max_storages)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool_in_child)


def recycled_uint8(num_bytes: int) -> torch.Tensor:
    """A uint8 tensor of num_bytes from this process's StoragePool."""
    return _POOL.allocate(num_bytes)


def release_pooled() -> None:
    """Give back the memory of this process's StoragePool that no batch uses (a loader closed)."""
    _POOL.release()


class SlabKeeper:
    """Main process: hold the slabs' storages seen in batches, so torch maps each one only once.

    torch rebuilds a received shared storage from its cache while some reference to it lives;
    without one, every batch would map (and page-fault) its slab afresh.
    """

    def __init__(self, max_storages: int) -> None:
        # Slabs in use come back every few batches and stay; one a worker replaced by a larger one
        # ages out after `max_storages` others were seen (a few slabs per worker and field).
        self._storages: OrderedDict[int, Any] = OrderedDict()  # data_ptr -> the storage (or what holds it)
        self.max_storages = max_storages

    def keep(self, batch: Any) -> None:
        if not isinstance(batch, dict):
            return
        for name, value in batch.items():
            # PackedBytes and decoded images live on slabs (never labels or masks)
            if isinstance(value, PackedBytes) or (name == "image" and isinstance(value, torch.Tensor)):
                storage = (value.data if isinstance(value, PackedBytes) else value).untyped_storage()
                self._hold(storage.data_ptr(), storage)

    def _hold(self, key: int, held: Any) -> None:
        """Hold `held` under `key`, the newest; the oldest beyond max_storages go (unmapped here)."""
        self._storages[key] = held
        self._storages.move_to_end(key)
        while len(self._storages) > self.max_storages:
            self._storages.popitem(last=False)
