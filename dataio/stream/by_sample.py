"""Decoded batches from local tar shards: each batch's samples read when its turn comes, not whole windows.

A decoded stream consumes ~100-300 samples/s per worker, ~100x slower than the page cache serves
them, so holding a whole shuffle window of bytes (plus the next one read ahead) buys nothing but
memory. Here the plan and its order are unchanged: the same windows, shuffled the same way, make
the same batches; only what is read when changes. Each batch's samples are read (one preadv each
into the batch's buffer, checked against the sample's checksum) a batch ahead within the read-ahead budget,
so a worker holds a few batches of bytes whatever the window or the dataset size. Object storage
keeps reading whole windows: per-sample requests there would break DESIGN.md's property 5.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dataio.errors import ShardFormatError
from dataio.plan.plan import Window
from dataio.plan.types import Segment
from dataio.readers.mixed import SourcePiece
from dataio.readers.tar import TarPayload, TarReader, zero_copy
from dataio.storage.prefetch import Prefetcher
from dataio.stream.job import OpenJob
from dataio.stream.raw_direct import ShardFiles, will_need
from dataio.stream.slabs import recycled_uint8

BatchRead = tuple[tuple[list[int], list[bool]], list[dict[str, Any]], float]  # ((ids, pads), samples, read_s)


def batch_ids(windows: Sequence[Window], *, start: int, skip: int, stop: int, batch_size: int,
              entering: Callable[[Window], None] = lambda w: None) -> Iterator[tuple[list[int], list[bool]]]:
    """(sample ids, is_pad) of each batch made from the slot's delivery positions (skip, stop], the
    windows' first sample being at position start + 1: the order the window stream makes them in.
    `entering(window)` runs as the first batch holding one of its samples is asked for."""
    position = start
    ids: list[int] = []
    pads: list[bool] = []
    for window in windows:
        if position + len(window.sample_ids) > skip and position < stop:
            entering(window)
        for sample_id, is_pad in zip(window.sample_ids.tolist(), window.is_pad.tolist()):
            position += 1
            if not skip < position <= stop:
                continue  # a batch made by another stream (the main process's first batch)
            ids.append(sample_id)
            pads.append(is_pad)
            if len(ids) == batch_size:
                yield ids, pads
                ids, pads = [], []
    assert not ids, "plan windows must hold whole batches"


class SampleReads:
    """One stream's reads of single samples into one buffer per batch: one preadv each on the
    shard's kept-open file, checked like TarReader.fetch (its index's span, the sample's checksum).
    A batch's buffer is one allocation, reused (slabs.StoragePool) once the batch's samples are
    gone; a hundred-KB `bytes` per sample would fill malloc's arenas, which keep what they held. Used by
    one thread at a time (the stream's read-ahead thread); close() after that thread has stopped."""

    def __init__(self, opened: OpenJob) -> None:
        self.opened = opened
        self.files = ShardFiles()

    def samples(self, ids: list[int]) -> list[dict[str, Any]]:
        """The samples of global `ids`, in order; their fields are views of the batch's buffer."""
        reader = self.opened.reader
        pieces = _pieces(self.opened, ids)
        spans = [self._tar(p).index(p.seg.shard).span(p.seg.start, p.seg.stop) for p in pieces]
        sizes = [end - begin for begin, end in spans]
        ends = np.cumsum(sizes).tolist()
        # From this process's StoragePool: a buffer is reused once nothing refers to it (every
        # sample's view of it gone), so its pages are not faulted in afresh each batch (~60 us per
        # sample of ~100 KB here); anything kept longer keeps its buffer out of reuse.
        size = ends[-1] if ends else 0
        pooled = self.opened.job.pooled_reads
        buffer = memoryview(recycled_uint8(size).numpy() if pooled else np.empty(size, dtype=np.uint8)).cast("B")
        out: list[dict[str, Any]] = []
        for piece, (begin, _), size, stop in zip(pieces, spans, sizes, ends):
            out.extend(reader.parse(piece, self._read(piece, begin, buffer[stop - size : stop])))
        return out

    def _tar(self, piece: SourcePiece) -> TarReader:
        return self.opened.reader.readers[piece.source]  # type: ignore[return-value]

    def _read(self, piece: SourcePiece, begin: int, into: memoryview) -> TarPayload:
        reader, seg = self._tar(piece), piece.seg
        rel = reader.manifest.shard_paths[seg.shard]
        try:
            got = os.preadv(self.files.fd(reader.store.path(rel)), [into], begin)
        except OSError:
            return zero_copy(reader.fetch(seg))  # the store's read: its retries, its error naming the URL
        index = reader.index(seg.shard)
        if got != len(into):
            raise ShardFormatError(
                f"{reader.store.url_of(rel)}: sample {index.samples[seg.start].key!r} (number {seg.start}) ends past "
                f"the end of the file ({got} of {len(into)} bytes read): the shard was truncated after it was "
                "written; rewrite the dataset")
        data: Any = into
        if reader.verify_checksums:
            data = reader.verified(seg, begin, data)
        return TarPayload(begin, data, index.samples[seg.start:seg.stop])

    def will_need(self, window: Window) -> None:
        """Ask the kernel to read the window's spans into the page cache in the background (its
        samples are then read in shuffled order, each of which would otherwise wait for the disk)."""
        reader = self.opened.reader
        for seg in window.segments:
            for piece in self.opened.split(seg):
                tar: TarReader = reader.readers[piece.source]  # type: ignore[assignment]
                if piece.seg.stop > piece.seg.start:
                    span = tar.index(piece.seg.shard).span(piece.seg.start, piece.seg.stop)
                    will_need(tar.store.path(tar.manifest.shard_paths[piece.seg.shard]), *span)

    def close(self) -> None:
        self.files.close()


def _pieces(opened: OpenJob, ids: list[int]) -> list[SourcePiece]:
    source, shard, position = opened.job.mixture.sources_of(np.asarray(ids, dtype=np.int64))
    return [SourcePiece(s, Segment(shard=sh, start=p, stop=p + 1))
            for s, sh, p in zip(source.tolist(), shard.tolist(), position.tolist())]


def batch_bytes(opened: OpenJob, ids: list[int]) -> int:
    """The bytes a batch's reads return (exact once the shards' indexes are loaded)."""
    return sum(opened.reader.payload_bytes(p) for p in _pieces(opened, ids))


def batch_reads(reads: SampleReads,
                batches: Iterator[tuple[list[int], list[bool]]]) -> tuple[Prefetcher, Iterator[BatchRead]]:
    """(its Prefetcher, each batch's samples) read ahead in one background thread (a batch's reads
    take milliseconds, its decode seconds) within the job's prefetch_bytes, the batch being decoded
    counted against it; closing the Prefetcher stops the thread."""
    opened = reads.opened
    prefetcher = Prefetcher(lambda b: reads.samples(b[0]), size_of=lambda b: batch_bytes(opened, b[0]),
                            budget_bytes=opened.job.prefetch_bytes, max_in_flight=1)
    return prefetcher, prefetcher.run(batches)
