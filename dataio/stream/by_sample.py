"""Decoded batches from local tar shards: each batch's samples read when its turn comes, not whole windows.

A decoded stream consumes ~100-300 samples/s per worker, ~100x slower than the page cache serves
them, so holding a whole shuffle window of bytes (plus the next one read ahead) buys nothing but
memory. Here the plan and its order are unchanged: the same windows, shuffled the same way, make
the same batches; only what is read when changes. Each batch's samples are read (one ranged read
each, checked against the sample's checksum) a batch or two ahead within the read-ahead budget,
so a worker holds a few batches of bytes whatever the window or the dataset size. Object storage
keeps reading whole windows: per-sample requests there would break DESIGN.md's property 5.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dataio.plan.plan import Window
from dataio.plan.types import Segment
from dataio.readers.mixed import MixedReader, SourcePiece
from dataio.readers.tar import zero_copy
from dataio.storage.prefetch import Prefetcher
from dataio.stream.job import OpenJob, WorkerJob

BatchRead = tuple[tuple[list[int], list[bool]], list[dict[str, Any]], float]  # ((ids, pads), samples, read_s)


def reads_by_sample(job: WorkerJob) -> bool:
    """Whether a decoding stream reads batch by batch: every dataset is tar shards in local files,
    read without a disk cache (a cache's point is whole ranges). From the job alone: no reader opened."""
    if job.decode is None or job.cache_dir is not None:
        return False
    return all(d.manifest.format == "tar" and d.store.is_local for d in job.datasets)


def batch_ids(windows: Sequence[Window], *, start: int, skip: int, stop: int,
              batch_size: int) -> Iterator[tuple[list[int], list[bool]]]:
    """(sample ids, is_pad) of each batch made from the slot's delivery positions (skip, stop], the
    windows' first sample being at position start + 1: the order the window stream makes them in."""
    position = start
    ids: list[int] = []
    pads: list[bool] = []
    for window in windows:
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


def read_samples(opened: OpenJob, ids: list[int]) -> list[dict[str, Any]]:
    """The samples of global `ids`, in order: one ranged read each (a sample's own bytes)."""
    reader = opened.reader
    out: list[dict[str, Any]] = []
    for piece in _pieces(opened, ids):
        out.extend(reader.parse(piece, zero_copy(reader.fetch(piece))))
    return out


def _pieces(opened: OpenJob, ids: list[int]) -> list[SourcePiece]:
    source, shard, position = opened.job.mixture.sources_of(np.asarray(ids, dtype=np.int64))
    return [SourcePiece(s, Segment(shard=sh, start=p, stop=p + 1))
            for s, sh, p in zip(source.tolist(), shard.tolist(), position.tolist())]


def batch_bytes(reader: MixedReader, opened: OpenJob, ids: list[int]) -> int:
    """The bytes a batch's reads return (exact once the shards' indexes are loaded)."""
    return sum(reader.payload_bytes(p) for p in _pieces(opened, ids))


def batch_reads(opened: OpenJob, batches: Iterator[tuple[list[int], list[bool]]]) -> tuple[Prefetcher, Iterator[BatchRead]]:
    """(its Prefetcher, each batch's samples) read ahead in background threads within the job's
    prefetch_bytes, the batch being decoded counted against it; closing the Prefetcher stops them."""
    job = opened.job
    prefetcher = Prefetcher(lambda b: read_samples(opened, b[0]),
                            size_of=lambda b: batch_bytes(opened.reader, opened, b[0]),
                            budget_bytes=job.prefetch_bytes, max_in_flight=job.max_in_flight)
    return prefetcher, prefetcher.run(batches)
