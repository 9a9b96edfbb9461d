"""What a batch is, between workers and the training loop.

A batch is a dict:
    "__key__": list[str]             sample keys, N of them, delivery order
    "label":   int64 tensor [N]      (-1 where the dataset has no label)
    "image":   uint8 tensor [N,3,H,W] when images are decoded (CPU or DALI),
    FIELD:     every other field of the samples (see dataio/stream/fields.py):
               list[str]                text (txt, string columns)
               list[Any]                JSON (json, nested columns), parsed with json.loads
               int64/float64/bool [N]   numbers (cls2, numeric columns) present in every sample
               PackedBytes              other bytes (npy, ...) and, when not decoded, each image
                                        field ("jpg", "png", ...): an empty item where a sample
                                        lacks the field
    "__shard__", "__position__": int64 tensor [N]   each sample's shard number and position in
                                     it (dataio.sources_of maps them to the source file / row)
    "mask":    bool tensor [N]       True for real samples; False for padding repeats and
                                     substitutes for skipped corrupt samples (never train on them
                                     twice, never count them in evaluation)
    "read_s", "decode_s": float      seconds this batch spent being read and decoded in its worker
    "batch_number": int              rank-level batch number within the epoch
    "source":  int64 tensor [N]      a mixture's batches only: each sample's index in the
                                     sources given to make_loader (see plan/mix.py)

Raw bytes travel as one uint8 tensor plus offsets (PackedBytes), so torch moves them through
shared memory instead of pickling N byte strings across the worker pipe. Iterating a PackedBytes
(or `views()`) gives each item as a memoryview into that tensor, without a copy; `to_list()` copies
each item into `bytes` once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch


class ViewGuard:
    """The per-sample memoryviews handed out of one batch on reused buffers (reuse_buffers=True).

    The loader releases them when the caller asks for the next batch, the moment the batch's slab
    may be written again: using a view after that raises ValueError instead of reading another
    batch's bytes, and `views()` on that batch raises too. What was made from a view without a copy
    is not guarded: `np.frombuffer(v)` keeps its own view (the slab stays mapped; its bytes change),
    `torch.frombuffer(v)` keeps none (slice `data` for a tensor). Copy what you keep.
    """

    __slots__ = ("_views", "_released")

    def __init__(self) -> None:
        self._views: list[memoryview] = []
        self._released = False

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return ViewGuard, ()  # views do not travel; a copied batch starts unguarded views afresh

    def track(self, views: list[memoryview]) -> None:
        if self._released:
            raise ValueError("this batch's bytes were in reused buffers (reuse_buffers=True) and the loader has "
                             "moved to the next batch, which may have overwritten them: take views (or "
                             "bytes(v) copies) before asking for the next batch, or leave reuse_buffers off")
        self._views.extend(views)

    def attach(self, batch: dict[str, Any]) -> dict[str, Any]:
        """`batch` with each PackedBytes value guarded by this guard (the dict is updated in place)."""
        for name, value in batch.items():
            if isinstance(value, PackedBytes):
                batch[name] = replace(value, guard=self)
        return batch

    def release(self) -> int:
        """Release every view handed out; returns how many could not be (a C extension holds one)."""
        self._released, views, self._views = True, self._views, []
        exported = 0
        for view in views:
            try:
                view.release()
            except BufferError:  # an object made from the view still holds it
                exported += 1
        return exported


@dataclass(frozen=True, slots=True)
class PackedBytes:
    """N byte strings packed into one uint8 tensor; item i is data[offsets[i]:offsets[i+1]].

    Iterating yields memoryviews (see `views`); `p[i]` and `to_list()` give `bytes` copies.
    """

    data: torch.Tensor  # uint8 [total_bytes]
    offsets: torch.Tensor  # int64 [N + 1], offsets[0] == 0
    # Set by the loader on batches in reused buffers: releases the views when the buffer is reused.
    guard: ViewGuard | None = field(default=None, compare=False, repr=False)

    @classmethod
    def pack(cls, items: Sequence[bytes]) -> PackedBytes:
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in items], out=offsets[1:])
        data = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
        return cls(torch.from_numpy(data), torch.from_numpy(offsets))

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    def __getitem__(self, i: int) -> bytes:
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])].numpy().tobytes()

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self.views())

    def views(self) -> list[memoryview]:
        """Every item as a memoryview into `data`, no copy (PIL via io.BytesIO(v), simplejpeg, DALI's
        external_source and bytes(v) take them). Valid as long as the batch; with reuse_buffers=True
        until the caller asks for the next batch, when they are released (using one raises ValueError)."""
        offs = self.offsets.tolist()
        whole = memoryview(self.data.numpy())
        views = [whole[start:end] for start, end in zip(offs, offs[1:])]
        if self.guard is not None:
            self.guard.track(views)
        return views

    def to_list(self) -> list[bytes]:
        """Every item copied into its own `bytes` (one copy each), for code that needs bytes."""
        keep_freed_heap()
        offs = self.offsets.tolist()
        whole = memoryview(self.data.numpy())
        return [bytes(whole[start:end]) for start, end in zip(offs, offs[1:])]

    @property
    def num_bytes(self) -> int:
        return int(self.data.numel())


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
# Multi-MB read buffers stay mmapped (freed straight back): served from arenas they fragment them
# (a reader's RSS crept ~350 MB above its budget over an epoch); smaller blocks come from the heap.
MMAP_THRESHOLD_BYTES = 1 << 20


def glibc_mallopt(*settings: tuple[int, int]) -> None:
    """mallopt(param, value) for each setting where the allocator is glibc's; elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        for param, value in settings:
            libc.mallopt(param, value)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator decides


_HEAP_KEPT = False


def keep_freed_heap() -> None:
    """Once per process (glibc only): let malloc keep freed heap for reuse instead of giving it back
    to the OS after every batch.

    A batch's `bytes` items (to_list) are freed together; with glibc's default trim threshold
    (128 KiB) that memory returns to the OS at once and the next batch page-faults it in again:
    measured ~30 µs per 108 KB item, 7x the copy itself (4 µs). Up to 64 MiB of freed heap is kept;
    the mmap threshold is fixed at the workers' 1 MiB (setting one threshold ends glibc's adaptive
    tuning of both), so items below it come from the kept heap and multi-MB buffers do not."""
    global _HEAP_KEPT
    if _HEAP_KEPT:
        return
    _HEAP_KEPT = True
    glibc_mallopt((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, 64 << 20))
