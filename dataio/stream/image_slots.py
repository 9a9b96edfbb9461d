"""Decoded-image batches on shared storages a worker reuses once the main process has let go of them.

Why: in a DataLoader worker, a fresh shared-memory tensor per DECODE batch (38.5 MB for 256 images
at 224) costs ~85 us of page faults per image, about a tenth of a sample's CPU. `reuse_buffers=True`
spares them under a lifetime rule (valid until the next batch); this spares them with none: a
storage is written again only once nothing in the main process refers to it any more.

How: each pooled storage ends with a 64-byte tail: a magic, how many times the worker filled it, how
many times the main process released it. The worker (SharedSlots, one per process) writes a batch
only into a storage whose two counts agree, else makes a new one (at most `max_slots`; beyond, fresh
storages that nobody pools, whose memory goes once the main process drops the batch). The main
process (SlotReleaser, a SlabKeeper) keeps each such storage it receives (so torch maps it once: it
rebuilds a received storage from its cache while a reference lives) with the fill count of the batch
it received there and, at each batch it delivers and as the caller asks for the next one, marks
released, up to that count, every kept storage whose use count says its own reference is the last:
the caller dropped the batch and every view, numpy array and tensor of it. Up to the count received,
not the tail's current one: a storage the worker filled again after a release travels in the queue
while nothing here refers to it yet. A batch handed on to another process by the caller is outside
this accounting: copy it first (`.clone()`), or use worker_mode='threads', whose batches come from
this process's StoragePool.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from dataio.stream.slabs import SlabKeeper

TAIL_BYTES = 64
_MAGIC = int.from_bytes(b"SHFYSLOT", "little") & (2**63 - 1)
_MAGIC_AT, _FILLED_AT, _RELEASED_AT = 0, 1, 2  # int64 words of the tail
_use_count = getattr(torch._C, "_storage_Use_Count", None)
# Pooled storages per worker: what is in flight while workers keep up with the caller (the batch the
# caller holds, the one the worker fills; the main process releases as the caller asks for the next).
# A worker running ahead (prefetch_factor, or a slower peer) takes fresh storages for the extra
# batches, pooled by nobody: their memory goes as they are dropped instead of staying resident.
POOLED_SLOTS = 2


def _tail(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage's last 64 bytes as 8 int64 words (a view: writes reach the other process)."""
    words = storage.nbytes() // 8
    return torch.empty(0, dtype=torch.int64).set_(storage, words - TAIL_BYTES // 8, (TAIL_BYTES // 8,))


def _padded(num_bytes: int) -> int:
    return -(-num_bytes // TAIL_BYTES) * TAIL_BYTES + TAIL_BYTES


class SharedSlots:
    """Worker side: shared uint8 tensors on pooled storages (see the module's docstring)."""

    def __init__(self, max_slots: int = POOLED_SLOTS) -> None:
        self.max_slots = max_slots
        self._slots: list[torch.UntypedStorage] = []

    def allocate(self, num_bytes: int) -> torch.Tensor:
        """A uint8 tensor of num_bytes in shared memory (contents undefined), on a storage the main
        process released, or a new one."""
        free = []
        for storage in self._slots:
            tail = _tail(storage)
            if storage.nbytes() - TAIL_BYTES >= num_bytes and int(tail[_FILLED_AT]) == int(tail[_RELEASED_AT]):
                free.append(storage)
        if free:
            storage = min(free, key=lambda s: s.nbytes())
        else:
            storage = torch.UntypedStorage._new_shared(_padded(num_bytes))
            if len(self._slots) >= self.max_slots or _use_count is None:
                return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (num_bytes,))  # not pooled: no tail
            _tail(storage).zero_()[_MAGIC_AT] = _MAGIC
            self._slots.append(storage)
        _tail(storage)[_FILLED_AT] += 1
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (num_bytes,))

    @property
    def num_slots(self) -> int:
        return len(self._slots)


_SLOTS: SharedSlots | None = None


def _slots_in_child() -> None:
    global _SLOTS
    _SLOTS = None  # a forked child pools its own storages, never its parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_slots_in_child)


def shared_slots() -> SharedSlots:
    """This process's SharedSlots (a DataLoader worker's)."""
    global _SLOTS
    if _SLOTS is None:
        _SLOTS = SharedSlots()
    return _SLOTS


class SlotReleaser(SlabKeeper):
    """Main process: keep the pooled storages of received image batches; release the unused ones."""

    def keep(self, batch: Any) -> None:
        """Keep the storage of `batch['image']` if a worker pooled it (its tail has the magic), with
        the fill count of this batch."""
        image = batch.get("image") if isinstance(batch, dict) else None
        if not isinstance(image, torch.Tensor) or image.device.type != "cpu" or _use_count is None:
            return
        storage = image.untyped_storage()
        if storage.nbytes() < 2 * TAIL_BYTES or storage.nbytes() % TAIL_BYTES or int(_tail(storage)[_MAGIC_AT]) != _MAGIC:
            return
        self._hold(storage.data_ptr(), (storage, int(_tail(storage)[_FILLED_AT])))

    def release_unused(self) -> int:
        """Mark released every kept storage referred to by nothing but this keeper; how many."""
        released = 0
        for storage, received in self._storages.values():
            if _use_count(storage._cdata) == 1:  # type: ignore[misc]  # only our reference
                # Up to the batch received, never the tail's own count: the worker may have filled
                # the storage again after our release, with that batch still in the queue to us.
                tail = _tail(storage)
                if int(tail[_RELEASED_AT]) != received:
                    tail[_RELEASED_AT] = received
                    released += 1
        return released
