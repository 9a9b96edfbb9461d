"""Tar shards for the RAW fast path: the index as numpy columns, byte spans read into a caller's buffer.

The loader's RAW path (dataio/stream/raw.py) never builds a dict per sample: it reads a window's
spans with few large reads straight into a reused buffer, and finds every member by index
arithmetic on these columns. A local file is read with os.preadv into the buffer (no `bytes`
object, no page faults once the buffer was used); object storage goes through Store.read_into (S3:
parallel ranged GETs received in place; retried and hedged as everywhere), a disk cache through
Store.read and one copy into the buffer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dataio.format.tar_index import TarIndex
from dataio.readers.base import cached_read
from dataio.storage.retry import TruncatedFileError
from dataio.storage.store import Store

if TYPE_CHECKING:
    from dataio.storage.cache import DiskCache


@dataclass(frozen=True, slots=True)
class TarColumns:
    """One shard's index as columns: for field f (exts[f]) and sample i, where its bytes are.

    offsets[f, i] is the member's data offset in the shard and sizes[f, i] its size, both -1 where
    sample i has no such member; ranks[f, i] is the member's position within its sample (for the
    batch's field order, as a sample dict would list them). keys[i] is the sample's key.
    """

    keys: np.ndarray  # object [n] of str
    exts: tuple[str, ...]
    offsets: np.ndarray  # int64 [F, n]
    sizes: np.ndarray  # int64 [F, n]
    ranks: np.ndarray  # int64 [F, n]

    @property
    def nbytes(self) -> int:
        """About how much memory the columns hold (the keys' str objects counted, as they may
        outlive the index they came from)."""
        return self.offsets.nbytes + self.sizes.nbytes + self.ranks.nbytes + 72 * len(self.keys)


def columns_of(index: TarIndex, fields: tuple[str, ...] | None) -> TarColumns:
    """The index's members as columns, projected to `fields` (None: every field): numpy over the
    index's own columns, no loop per sample.

    A field twice in one sample keeps the last member's bytes at the first one's position, as
    TarReader.parse's dict does (rare: such an index takes the loop, _columns_by_sample).
    """
    c = index.columns
    n = len(c.keys)
    keep = [i for i, e in enumerate(c.exts) if fields is None or e in fields]
    new_id = np.full(len(c.exts), -1, dtype=np.int64)
    new_id[keep] = np.arange(len(keep))
    field = new_id[c.member_ext]
    chosen = field >= 0
    sample, field = c.member_sample[chosen], field[chosen]
    if len(np.unique(sample * max(len(keep), 1) + field)) != len(sample):
        return _columns_by_sample(index, fields)
    exts = tuple(c.exts[i] for i in keep)
    offsets = np.full((len(exts), n), -1, dtype=np.int64)
    sizes = np.full((len(exts), n), -1, dtype=np.int64)
    ranks = np.full((len(exts), n), -1, dtype=np.int64)
    offsets[field, sample] = c.member_offset[chosen]
    sizes[field, sample] = c.member_size[chosen]
    ranks[field, sample] = np.arange(len(sample)) - np.searchsorted(sample, sample)  # place among the kept
    keys = np.empty(n, dtype=object)
    keys[:] = c.keys
    return TarColumns(keys=keys, exts=exts, offsets=offsets, sizes=sizes, ranks=ranks)


def _columns_by_sample(index: TarIndex, fields: tuple[str, ...] | None) -> TarColumns:
    """columns_of by a loop over the samples (the reference; for indexes with a field twice in a sample)."""
    samples = index.samples
    n = len(samples)
    exts: dict[str, int] = {}
    for sample in samples:
        for member in sample.members:
            if member.ext not in exts and (fields is None or member.ext in fields):
                exts[member.ext] = len(exts)
    offsets = np.full((len(exts), n), -1, dtype=np.int64)
    sizes = np.full((len(exts), n), -1, dtype=np.int64)
    ranks = np.full((len(exts), n), -1, dtype=np.int64)
    keys = np.empty(n, dtype=object)
    for i, sample in enumerate(samples):
        keys[i] = sample.key
        rank = 0
        for member in sample.members:
            f = exts.get(member.ext)
            if f is None:
                continue
            if ranks[f, i] < 0:
                ranks[f, i] = rank
                rank += 1
            offsets[f, i], sizes[f, i] = member.offset, member.size
    return TarColumns(keys=keys, exts=tuple(exts), offsets=offsets, sizes=sizes, ranks=ranks)


def read_span_into(store: Store, cache: DiskCache | None, rel: str, start: int, end: int, dest: memoryview,
                   *, checksum: str, object_size: int | None = None) -> None:
    """Bytes [start, end) of `rel` written into dest[: end - start]; a short read is retried, then fails
    with the Store's error naming the URL (as Store.read, which checks object_size where it can)."""
    want = end - start
    if want <= 0:
        return
    if cache is None and store.is_local and hasattr(os, "preadv"):
        path = store.path(rel)

        def once() -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                got = 0
                while got < want:
                    n = os.preadv(fd, [dest[got:want]], start + got)
                    if n <= 0:
                        break
                    got += n
            finally:
                os.close(fd)
            if got != want:  # a local file does not grow by asking again (Store.read says the same)
                raise TruncatedFileError(f"got {got} bytes, expected {want}: the file is shorter than the dataset "
                                         "says (cut short or changed after it was written)")

        store._retry(once, f"reading {store.url_of(rel)} bytes {start}-{end}")
        return
    if cache is None:  # object storage: received in place (S3: parallel parts, no bytes object)
        store.read_into(rel, start, end, dest, object_size=object_size)
        return
    data = cached_read(store, cache, rel, start, end, checksum=checksum, object_size=object_size)
    dest[:want] = memoryview(data).cast("B")[:want]
