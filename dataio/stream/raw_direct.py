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
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from dataio.batch import PackedBytes
from dataio.readers.tar import TarReader
from dataio.readers.tar_raw import read_span_into
from dataio.stream.collate import _new_uint8
from dataio.stream.raw_batch import Part, aligned_fields

MAX_OPEN_FILES = 32  # per stream: a window spans a few shards


@dataclass(frozen=True, slots=True)
class ShardSource:
    """Where a global shard's bytes are: its local path, and the reader and shard number that
    can read and check it again (the slow path)."""

    path: str
    reader: TarReader
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
        aligned = {name: np.concatenate([aligned_fields(p, getattr(p, name), exts) for p in parts], axis=1)
                   for name in ("offsets", "sizes", "ranks")}
        flat = {name: np.concatenate([getattr(p, name) for p in parts])
                for name in ("keys", "ids", "mask", "shards", "positions", "starts", "ends", "sums", "checked")}
        return Rows(exts=exts, **aligned, **flat)


def will_need(path: str, start: int, end: int) -> None:
    """Ask the kernel to read bytes [start, end) of a local file into the page cache, in the
    background and in large sequential reads (a window's samples are then read in shuffled order,
    one preadv each, and would otherwise each wait for the disk). Costs no process memory."""
    if not hasattr(os, "posix_fadvise") or end <= start:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


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
        # Reads in file order (delivery stays the plan's): per sample its iovecs, from plain int
        # lists, made just before its preadv. Nothing per sample outlives its read: a batch leaves no
        # thousands of live objects behind that would set off the cyclic GC (a full collection walks
        # every object torch's import made, tens of ms).
        seg_buf, seg_at, seg_len, seg_lo = _segments(rows, packed, out_at, rest_at)
        order = np.lexsort((rows.starts, rows.shards))
        order = order[rows.ends[order] > rows.starts[order]].tolist()
        shards = rows.shards.tolist()
        fds = {s: self.files.fd(self.source_of(s).path) for s in set(shards)}
        job = _Job(bufs=[memoryview(self._scratch)] + [memoryview(outs[f].numpy()) for f in packed],
                   seg=(seg_buf.tolist(), seg_at.tolist(), seg_len.tolist(), seg_lo.tolist()),
                   fd=[fds[s] for s in shards], start=rows.starts.tolist(), length=(rows.ends - rows.starts).tolist(),
                   want=rows.sums.tolist(), checked=rows.checked.tolist())
        for i in self._run_all(job, order):
            self._slow(self.source_of(shards[i]), int(rows.positions[i]), job.start[i],
                       job.start[i] + job.length[i], job.iov(i))
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

    def _run_all(self, job: _Job, order: list[int]) -> list[int]:
        """Read samples `order` (with an I/O thread's help where `submit` is given); the failed ones.

        Both threads take the next sample from one iterator (atomic under the GIL): a helper that is
        late or descheduled on a busy machine costs at most the read it holds, never half a batch."""
        shared = iter(order)
        if self.submit is None or len(order) < 2:
            return job.run(shared)
        helper = self.submit(job.run, shared)
        try:
            mine = job.run(shared)
        finally:
            theirs = [] if helper.cancel() else helper.result()  # not started: nothing to wait for
        return sorted(mine + theirs)

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


@dataclass
class _Job:
    """One batch's reads as int lists: sample i's iovecs are segments seg_lo[i]..seg_lo[i+1] (buffer
    seg_buf, offset seg_at, length seg_len; buffer 0 is the scratch, then the packed fields')."""

    bufs: list[memoryview]
    seg: tuple[list[int], list[int], list[int], list[int]]
    fd: list[int]
    start: list[int]
    length: list[int]
    want: list[int]
    checked: list[bool]

    def iov(self, i: int) -> list[memoryview]:
        seg_buf, seg_at, seg_len, seg_lo = self.seg
        bufs = self.bufs
        return [bufs[seg_buf[x]][seg_at[x]: seg_at[x] + seg_len[x]] for x in range(seg_lo[i], seg_lo[i + 1])]

    def run(self, samples: Iterator[int]) -> list[int]:
        """Each sample's preadv and checksum; the samples read short or not matching."""
        failed = []
        for i in samples:
            iov = self.iov(i)
            if os.preadv(self.fd[i], iov, self.start[i]) != self.length[i] or (
                    self.checked[i] and not _matches(iov, self.want[i])):
                failed.append(i)
        return failed


def _segments(rows: Rows, packed: list[int], out_at: dict[int, np.ndarray],
              rest_at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each sample's span [starts, ends) cut into iovecs: its packed members at their places in their
    fields' outputs (buffer 1 + position in `packed`), every gap before, between and after them in
    the scratch (buffer 0) from rest_at[i] on. (buf, at, len) [segments] grouped by sample in
    offset order, and seg_lo [k + 1]: sample i's are seg_lo[i]..seg_lo[i + 1]; empty ones left out."""
    k = len(rows.ids)
    # Packed members present: sample, offset, size, buffer, place; sorted by (sample, offset).
    cols = [(np.flatnonzero(rows.sizes[f] > 0), f, b + 1) for b, f in enumerate(packed)]
    e_i = np.concatenate([c[0] for c in cols] + [np.empty(0, np.int64)])
    e_off = np.concatenate([rows.offsets[f][i] for i, f, _ in cols] + [np.empty(0, np.int64)])
    e_len = np.concatenate([rows.sizes[f][i] for i, f, _ in cols] + [np.empty(0, np.int64)])
    e_buf = np.concatenate([np.full(len(i), b) for i, _, b in cols] + [np.empty(0, np.int64)])
    e_at = np.concatenate([out_at[f][i] for i, f, _ in cols] + [np.empty(0, np.int64)])
    o = np.lexsort((e_off, e_i))
    e_i, e_off, e_len, e_buf, e_at = e_i[o], e_off[o], e_len[o], e_buf[o], e_at[o]
    first = np.ones(len(e_i), dtype=bool)
    first[1:] = e_i[1:] != e_i[:-1]
    prev_end = np.where(first, rows.starts[e_i], np.concatenate([[0], e_off[:-1] + e_len[:-1]]))
    last_end = rows.starts.copy()
    last_end[e_i] = e_off + e_len  # the last of each sample's members wins (sorted by offset)
    # Segments: before each member its gap (order 2r), the member (2r + 1); the tail last.
    rank = np.arange(len(e_i)) - np.searchsorted(e_i, e_i)
    sample = np.concatenate([e_i, e_i, np.arange(k)])
    seq = np.concatenate([2 * rank, 2 * rank + 1, np.full(k, 1 << 40)])
    buf = np.concatenate([np.zeros(len(e_i), np.int64), e_buf, np.zeros(k, np.int64)])
    length = np.concatenate([e_off - prev_end, e_len, np.maximum(rows.ends - last_end, 0)])
    at = np.concatenate([np.zeros(len(e_i), np.int64), e_at, np.zeros(k, np.int64)])
    o = np.lexsort((seq, sample))
    sample, buf, length, at = sample[o], buf[o], length[o], at[o]
    gap = buf == 0  # the scratch takes the gaps one after another: rest_at[i] + the sample's earlier gaps
    gap_at = np.cumsum(np.where(gap, length, 0)) - np.where(gap, length, 0)
    at = np.where(gap, gap_at + rest_at[0], at)
    keep = length > 0
    seg_lo = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.bincount(sample[keep], minlength=k), out=seg_lo[1:])
    return buf[keep], at[keep], length[keep], seg_lo


def _matches(iov: list[memoryview], want: int) -> bool:
    h = xxhash.xxh3_64()
    for v in iov:
        h.update(v)
    return h.intdigest() == want
