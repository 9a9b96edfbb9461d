"""RAW batches from local tar shards read straight into the batch: no window buffer, one copy per byte.

For shards on a local file system (no disk cache) a RAW stream needs no window buffer: the index
says where every sample lies, so each batch's samples are read with one os.preadv per sample
(in shard and offset order) whose iovecs are the batch's own output buffers: each bytes/image
member lands at its place in its field's PackedBytes tensor, everything else of the sample's
span (tar headers, padding, small fields such as the label, members not projected) in a small
reused scratch buffer the labels and other fields are parsed from. That is what ImageFolder does
per file, without opening one per sample; memory is the batches themselves.

Checksums: a sample's xxh3 covers its whole span [first member's data, last member's end), so
it is computed over the iovecs in order (xxh3 streaming), over the bytes as they lie in the
batch. A mismatch or a short read reads the span again through the Store (retried, errors
naming the URL) and checks it with the reader (TarReader.verified: ShardFormatError naming the
shard and the sample's key).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from dataio.batch import PackedBytes
from dataio.loader.collate import _new_uint8
from dataio.loader.raw_batch import Part
from dataio.readers.tar_raw import read_span_into

MAX_OPEN_FILES = 32  # per stream: a window spans a few shards


@dataclass(frozen=True, slots=True)
class ShardSource:
    """Where a global shard's bytes are: its local path, and the reader and shard number that
    can read and check it again (the slow path)."""

    path: str
    reader: Any
    shard: int  # in the reader's own manifest


@dataclass(frozen=True, slots=True)
class _OneSample:
    """A segment of one sample, for TarReader.verified."""

    shard: int
    start: int
    stop: int


@dataclass
class Rows:
    """k samples of a batch in delivery order, where they lie in their shards (no bytes yet)."""

    exts: tuple[str, ...]
    offsets: np.ndarray  # int64 [F, k] member data offsets in the shard, -1 absent
    sizes: np.ndarray  # int64 [F, k], -1 absent
    ranks: np.ndarray  # int64 [F, k]
    keys: np.ndarray  # object [k]
    ids: np.ndarray  # int64 [k]
    mask: np.ndarray  # bool [k]
    shards: np.ndarray  # int64 [k] global shard
    positions: np.ndarray  # int64 [k] the sample's number in its shard
    starts: np.ndarray  # int64 [k] the sample's span [starts, ends) in its shard: what is read
    ends: np.ndarray  # int64 [k]
    sums: np.ndarray  # uint64 [k] expected xxh3-64 of the span
    checked: np.ndarray  # bool [k] whether sums[i] is to be checked

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]
        exts = tuple(dict.fromkeys(e for p in parts for e in p.exts))
        aligned = {name: np.concatenate([_aligned(p, getattr(p, name), exts) for p in parts], axis=1)
                   for name in ("offsets", "sizes", "ranks")}
        flat = {name: np.concatenate([getattr(p, name) for p in parts])
                for name in ("keys", "ids", "mask", "shards", "positions", "starts", "ends", "sums", "checked")}
        return Rows(exts=exts, **aligned, **flat)


class ShardFiles:
    """Open descriptors of the local shards a stream reads (one stream, one thread at a time)."""

    def __init__(self, max_open: int = MAX_OPEN_FILES) -> None:
        self.max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()

    def fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
            while len(self._fds) > self.max_open:
                os.close(self._fds.popitem(last=False)[1])
        else:
            self._fds.move_to_end(path)
        return fd

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


class DirectReader:
    """Rows -> one Part whose bytes fields are already packed (see the module docstring)."""

    def __init__(self, *, packs: Callable[[str], bool], source_of: Callable[[int], ShardSource],
                 submit: Callable[..., Future] | None = None) -> None:
        # submit: a lone stream in its process (num_workers=0, a worker process) reads half of each
        # batch in an I/O thread: the kernel's copies run side by side (they release the GIL).
        self.packs, self.source_of, self.submit = packs, source_of, submit
        self.files = ShardFiles()
        self._scratch = np.empty(0, dtype=np.uint8)

    def close(self) -> None:
        self.files.close()

    def read(self, rows: Rows) -> Part:
        start_s = time.perf_counter()
        packed = [f for f, e in enumerate(rows.exts) if self.packs(e)]
        k = len(rows.ids)
        # Packed fields: each member's place in its field's output tensor (item i at out_at[f][i]).
        out_at, outs = {}, {}
        for f in packed:
            at = np.zeros(k + 1, dtype=np.int64)
            np.cumsum(np.maximum(rows.sizes[f], 0), out=at[1:])
            out_at[f], outs[f] = at, _new_uint8(int(at[-1]))
        # The rest of each span goes to the scratch, sample after sample: rest_at[i] is where.
        spans = np.maximum(rows.ends - rows.starts, 0)
        packed_len = sum((np.maximum(rows.sizes[f], 0) for f in packed), np.zeros(k, dtype=np.int64))
        rest_at = np.zeros(k + 1, dtype=np.int64)
        np.cumsum(spans - packed_len, out=rest_at[1:])
        if self._scratch.nbytes < rest_at[-1]:
            self._scratch = np.empty(max(int(rest_at[-1]), 2 * self._scratch.nbytes), dtype=np.uint8)
        views = {f: memoryview(outs[f].numpy()) for f in packed}
        members = _packed_members(rows, packed, out_at)  # per sample: [(offset, size, f, place)] by offset
        scratch = memoryview(self._scratch)
        order = np.lexsort((rows.starts, rows.shards))  # read in file order; deliver in plan order
        starts, ends, shards = rows.starts.tolist(), rows.ends.tolist(), rows.shards.tolist()
        sums, checked, rest = rows.sums.tolist(), rows.checked.tolist(), rest_at.tolist()
        reads: list[tuple[int, list[memoryview], int, int, int | None, int]] = []
        for i in order.tolist():
            a, b = starts[i], ends[i]
            if b <= a:
                continue
            iov, pos, at = [], a, rest[i]
            for off, size, f, place in members[i]:
                if off > pos:
                    iov.append(scratch[at: at + off - pos])
                    at += off - pos
                iov.append(views[f][place: place + size])
                pos = off + size
            if b > pos:
                iov.append(scratch[at: at + b - pos])
            reads.append((self.files.fd(self.source_of(shards[i]).path), iov, a, b - a,
                          sums[i] if checked[i] else None, i))
        for j in self._run_all(reads):
            _, iov, a, n, _, i = reads[j]
            self._slow(self.source_of(shards[i]), int(rows.positions[i]), a, a + n, iov)
        # Where every member lies: packed ones in their field's tensor, the others in the scratch.
        offsets = rows.offsets.copy()
        for f in range(len(rows.exts)):
            if f in out_at:
                offsets[f] = np.where(rows.sizes[f] >= 0, out_at[f][:-1], -1)
                continue
            before = sum((np.where((rows.sizes[p] >= 0) & (rows.offsets[p] < rows.offsets[f]), rows.sizes[p], 0)
                          for p in packed), np.zeros(k, dtype=np.int64))
            offsets[f] = np.where(rows.sizes[f] >= 0, rest_at[:-1] + rows.offsets[f] - rows.starts - before, -1)
        return Part(buf=self._scratch, exts=rows.exts, offsets=offsets, sizes=rows.sizes, ranks=rows.ranks,
                    keys=rows.keys, ids=rows.ids, mask=rows.mask, shards=rows.shards,
                    read_s=time.perf_counter() - start_s,
                    field_bufs={rows.exts[f]: outs[f].numpy() for f in packed},
                    packed={rows.exts[f]: PackedBytes(outs[f], torch.from_numpy(out_at[f])) for f in packed})

    def _run_all(self, reads: list) -> list[int]:
        """Run the reads (the first half in an I/O thread where `submit` is given); the failed ones."""
        if self.submit is None or len(reads) < 2:
            return _run(reads, 0)
        half = len(reads) // 2
        first = self.submit(_run, reads[:half], 0)
        try:
            second = _run(reads[half:], half)
        finally:
            failed = first.result()  # its error first, then ours
        return failed + second

    def _slow(self, source: ShardSource, position: int, a: int, b: int, iov: list[memoryview]) -> None:
        """The span read again through the Store (short reads retried, errors naming the URL) and
        checked by the reader (ShardFormatError naming the sample); then scattered into `iov`."""
        reader = source.reader
        rel = reader.manifest.shard_paths[source.shard]
        data = bytearray(b - a)
        read_span_into(reader.store, None, rel, a, b, memoryview(data), checksum=reader.manifest.shard_checksums[
            source.shard])
        if getattr(reader, "verify_checksums", False):
            reader.verified(_OneSample(source.shard, position, position + 1), a, data)
        at = 0
        for v in iov:
            v[:] = data[at: at + len(v)]
            at += len(v)


def _run(reads: list, base: int) -> list[int]:
    """Each read's preadv and checksum; the positions (from `base`) of short or mismatched ones."""
    failed = []
    for j, (fd, iov, a, n, want, _) in enumerate(reads):
        if os.preadv(fd, iov, a) != n or (want is not None and not _matches(iov, want)):
            failed.append(base + j)
    return failed


def _matches(iov: list[memoryview], want: int) -> bool:
    h = xxhash.xxh3_64()
    for v in iov:
        h.update(v)
    return h.intdigest() == want


def _packed_members(rows: Rows, packed: list[int], out_at: dict[int, np.ndarray]) -> list[list[tuple]]:
    """Per sample, its packed members as (shard offset, size, field, place in the output), by offset."""
    k = len(rows.ids)
    per: list[list[tuple]] = [[] for _ in range(k)]
    for f in packed:
        for i, (off, size, place) in enumerate(zip(rows.offsets[f].tolist(), rows.sizes[f].tolist(),
                                                   out_at[f][:-1].tolist())):
            if size > 0:
                per[i].append((off, size, f, place))
    if len(packed) > 1:
        for m in per:
            m.sort()
    return per


def _aligned(rows: Rows, values: np.ndarray, exts: tuple[str, ...]) -> np.ndarray:
    if rows.exts == exts:
        return values
    out = np.full((len(exts), values.shape[1]), -1, dtype=np.int64)
    for f, ext in enumerate(rows.exts):
        out[exts.index(ext)] = values[f]
    return out
