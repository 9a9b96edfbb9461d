"""RAW batches without per-sample objects: windows read into reused buffers, batches gathered by index.

For decode=None on tar shards (no transform/collate hook; one dataset or a mixture of tar sources,
plan/mix.py: global shard numbers, each piece read by its source's reader) a slot's stream does not
parse samples into dicts. Each shuffle window's pieces are read with few large reads (os.preadv
for local files, ranged GETs for object storage) straight into a window buffer taken from the
process's RawIo; the tar index, as numpy columns (readers/tar_raw.py), says where every member
lies in that buffer; each batch's PackedBytes are gathered from it by slices into one output
tensor (offsets: a cumsum). Keys come from the index, labels from the .cls bytes; a batch whose
text/JSON/number field does not parse goes through the general path (collate.assemble), which
raises or substitutes exactly as for any other batch.

Local shards without a disk cache take no window buffer at all: windows are only laid out (offsets
in the shards, each sample's checksummed span) and each batch is read straight into its own
tensors (raw_direct.py); a lone stream lays out its next window in an I/O thread.

Buffers (object storage, a disk cache) come from the process's RawIo (raw_io.py): one window buffer
per stream for the window it serves, plus `spares` shared by the whole process for reading the next
window ahead. Buffers are reused, so their pages fault once.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataio.format.manifest import Manifest
from dataio.plan.plan import Window
from dataio.plan.types import PlanState, Segment
from dataio.readers.mixed import MixedReader
from dataio.readers.tar import TarReader
from dataio.readers.tar_raw import TarColumns, columns_of, read_span_into
from dataio.stream.job import OpenJob
from dataio.stream.raw_batch import BatchBuilder, CarryArena, Part
from dataio.stream.raw_direct import DirectReader, Rows, ShardSource, will_need
from dataio.stream.raw_io import IO_THREAD_PREFIX, RawIo


@dataclass(frozen=True, slots=True)
class _Piece:
    """A piece of a window's segment in its source: that source's reader and manifest, the piece in
    the source's own shard numbers, and its global shard (the sources' concatenated; one dataset:
    the same)."""

    reader: TarReader
    manifest: Manifest
    seg: Segment
    shard: int


@dataclass
class _Window:
    """One window being read or served: its buffer, its pieces' reads and where every member lies
    (direct: no buffer, no reads; offsets in the shards, and each sample's span and checksum)."""

    window: Window
    buf: np.ndarray | None
    ahead: bool  # the buffer was taken as a spare (not yet promoted)
    reads: list[Future]
    ids: np.ndarray  # int64 [rows] global id of each row (rows: the window's samples in read order)
    order: np.ndarray  # int64 [rows] argsort of ids
    shard: np.ndarray  # int64 [rows]
    keys: np.ndarray  # object [rows]
    exts: tuple[str, ...]
    offsets: np.ndarray  # int64 [F, rows] member offsets in buf, -1 absent
    sizes: np.ndarray  # int64 [F, rows]
    ranks: np.ndarray  # int64 [F, rows]
    read_s: float = 0.0
    direct: dict[str, np.ndarray] | None = None  # positions, starts, ends, sums, checked: [rows] each

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        return self.order[np.searchsorted(self.ids, ids, sorter=self.order)]


class RawStream:
    """The RAW batches of one WorkerSlot for one iteration (WorkerStream's interface), no dicts."""

    def __init__(self, opened: OpenJob, worker_id: int, state: PlanState, io: RawIo) -> None:
        job = opened.job
        self.opened, self.io, self.job = opened, io, job
        self.epoch = state.epoch
        self.state = state  # where it started: the next epoch's bet keeps its skip list
        self.numbers_before = sum(p.batches for p in state.progress)
        self.plan = job.plan(worker_id, state)
        self._numbers = self.plan.batch_numbers.tolist()
        self._last = self._numbers[-1] if self._numbers else -1
        self._offsets = job.mixture.shard_starts  # global id of each global shard's first sample
        self._builder = BatchBuilder(opened, epoch=state.epoch, url_of_shard=opened.url_of_shard)
        self._next_window = 0  # the next window to read
        self._cur: _Window | None = None
        self._ahead: _Window | Future | None = None  # a Future: a direct layout being made
        self._pos = 0  # the next sample of the current window to deliver
        self._produced = 0
        self._carry = CarryArena()
        self._sources: dict[int, ShardSource] = {}
        # Local shards are read straight into each batch (raw_direct.py): no window buffers.
        self._direct = DirectReader(packs=self._builder.packs, source_of=self._sources.__getitem__,
                                    submit=io.submit if io.lone else None) if all_local(opened.reader) else None
        self.finished = False

    # --- reading windows ----------------------------------------------------------------
    def _pieces(self, seg: Segment) -> list[_Piece]:
        """A window's segment as pieces its datasets' readers read (readers.base.split_segment)."""
        reader = self.opened.reader
        return [_Piece(reader.readers[p.source], reader.manifests[p.source], p.seg,
                       reader.shard_base[p.source] + p.seg.shard) for p in reader.split_segment(seg)]

    def _columns(self, p: _Piece) -> TarColumns:
        return self.io.columns.get_or_load(p.shard, lambda: columns_of(p.reader.index(p.seg.shard), p.reader.fields))

    def _start(self, *, ahead: bool) -> _Window | None:
        """Lay out the next window and submit its reads into a buffer (None: no spare buffer now);
        direct: only its layout."""
        if self._direct is not None:
            self._next_window += 1
            return self._lay_out(self._next_window - 1)
        window = self.plan.windows[self._next_window]
        pieces = [p for seg in window.segments for p in self._pieces(seg)]
        _load_indexes([(p.reader, p.seg.shard) for p in pieces if p.seg.stop > p.seg.start], self.job.max_in_flight)
        spans, total = [], 0
        for p in pieces:
            seg = p.seg
            begin, end = p.reader.index(seg.shard).span(seg.start, seg.stop) if seg.stop > seg.start else (0, 0)
            spans.append((begin, end, total))
            total += end - begin
        buf = self.io.take(total, ahead=ahead)
        if buf is None:
            return None
        self._next_window += 1
        try:
            w = self._layout(window, pieces, spans, buf, ahead)
        except BaseException:
            self.io.give(buf, ahead=ahead)
            raise
        view = memoryview(buf)
        for p, (begin, end, at) in zip(pieces, spans):
            w.reads.append(self.io.submit(self._read, p, begin, end, view[at: at + end - begin]))
        return w

    def _read(self, p: _Piece, begin: int, end: int, dest: memoryview) -> float:
        """Read the piece's span into its place in the window buffer (and check it, as TarReader.fetch)."""
        start = time.perf_counter()
        m, reader, piece = p.manifest, p.reader, p.seg
        read_span_into(reader.store, reader.cache, m.shard_paths[piece.shard], begin, end, dest,
                       checksum=m.shard_checksums[piece.shard], object_size=m.shard_num_bytes[piece.shard])
        if getattr(reader, "verify_checksums", False) and end > begin:
            checked = reader.verified(piece, begin, dest)
            if checked is not dest:  # a damaged cached copy was read again from the store
                dest[: end - begin] = memoryview(checked).cast("B")
        return time.perf_counter() - start

    def _layout(self, window: Window, pieces: list, spans: list, buf: np.ndarray, ahead: bool) -> _Window:
        cols = [self._columns(p) for p in pieces]
        exts = tuple(dict.fromkeys(e for c in cols for e in c.exts))
        n = sum(p.seg.stop - p.seg.start for p in pieces)
        offsets = np.full((len(exts), n), -1, dtype=np.int64)
        sizes, ranks = offsets.copy(), offsets.copy()
        ids, shard, keys = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, dtype=object)
        row = 0
        for p, c, (begin, _, at) in zip(pieces, cols, spans):
            a, b = p.seg.start, p.seg.stop
            rows = slice(row, row + b - a)
            ids[rows] = self._offsets[p.shard] + np.arange(a, b)
            shard[rows], keys[rows] = p.shard, c.keys[a:b]
            for f, ext in enumerate(c.exts):
                g = exts.index(ext)
                off = c.offsets[f, a:b]
                offsets[g, rows] = np.where(off >= 0, off - begin + at, -1)
                sizes[g, rows], ranks[g, rows] = c.sizes[f, a:b], c.ranks[f, a:b]
            row += b - a
        return _Window(window=window, buf=buf, ahead=ahead, reads=[], ids=ids, order=np.argsort(ids, kind="stable"),
                       shard=shard, keys=keys, exts=exts, offsets=offsets, sizes=sizes, ranks=ranks)

    def _lay_out(self, number: int) -> _Window:
        """Window `number`'s layout for direct reads (its shards' indexes and sums loaded)."""
        window = self.plan.windows[number]
        pieces = [p for seg in window.segments for p in self._pieces(seg)]
        _load_indexes([(p.reader, p.seg.shard) for p in pieces if p.seg.stop > p.seg.start], self.job.max_in_flight)
        return self._layout_direct(window, pieces)

    def _layout_direct(self, window: Window, pieces: list[_Piece]) -> _Window:
        """A window's layout in its shards (offsets as the index says) and each sample's span to read:
        the checksummed span where sums are checked, else its projected members' extent."""
        w = self._layout(window, pieces, [(0, 0, 0)] * len(pieces), None, False)
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("positions", "starts", "ends", "sums", "checked")}
        for p in pieces:
            a, b = p.seg.start, p.seg.stop
            source = self._sources.setdefault(p.shard, ShardSource(
                path=p.reader.store.path(p.manifest.shard_paths[p.seg.shard]), reader=p.reader, shard=p.seg.shard))
            if b > a:  # the window's bytes not in the page cache come in while earlier batches are read
                will_need(source.path, *p.reader.index(p.seg.shard).span(a, b))
            sums = p.reader.sample_sums(p.seg.shard) if getattr(p.reader, "verify_checksums", False) else None
            if sums is not None:
                starts, ends, want = sums.starts[a:b], sums.ends[a:b], sums.sums[a:b]
            else:
                c = self._columns(p)
                off, size = c.offsets[:, a:b], c.sizes[:, a:b]
                present = size >= 0
                starts = np.where(present, off, np.iinfo(np.int64).max).min(axis=0, initial=np.iinfo(np.int64).max)
                ends = np.where(present, off + size, 0).max(axis=0, initial=0)
                starts = np.where(present.any(axis=0), starts, 0)
                want = np.zeros(b - a, dtype=np.uint64)
            for k, v in zip(cols, (np.arange(a, b), starts, ends, want, np.full(b - a, sums is not None))):
                cols[k].append(v)
        w.direct = {k: np.concatenate(v) if v else np.empty(0) for k, v in cols.items()}
        return w

    def _advance(self) -> _Window:
        """The next window, read completely, as the current one (the old buffer given back)."""
        old, self._cur = self._cur, None
        if old is not None and old.buf is not None:
            self.io.give(old.buf, ahead=old.ahead)
        w, self._ahead = self._ahead, None
        if isinstance(w, Future):  # a layout (direct) or a window's start made in an I/O thread
            w = w.result()
        if w is None:
            w = self._start(ahead=False)
        elif w.ahead:
            self.io.promote()
            w.ahead = False
        assert w is not None
        w.read_s = sum(f.result() for f in w.reads)  # a read's error is raised here, at its window
        self._cur, self._pos = w, 0
        return w

    def _read_ahead(self) -> None:
        ahead = self._ahead
        if isinstance(ahead, Future) and self._direct is None and ahead.done() and ahead.exception() is None \
                and ahead.result() is None:
            self._ahead = None  # no spare buffer then: try again
        if self._ahead is not None or self._next_window >= len(self.plan.windows):
            return
        if self._direct is None:
            # In an I/O thread: the next window's indexes and sidecars (small requests, one of which
            # may stall) are fetched beside this window's batches, not before the next batch.
            self._ahead = self.io.submit(lambda: self._start(ahead=True))
        elif self.io.lone:  # the next window's indexes parsed in an I/O thread, beside this one's reads
            self._next_window += 1
            self._ahead = self.io.submit(self._lay_out, self._next_window - 1)

    def warm_up(self) -> None:
        """Start the first window in an I/O thread (its indexes, its layout, its reads) and return at
        once; batches wait for their tickets. Called where the iteration probably starts, before it
        does: when the loader is built (num_workers=0, a worker process) or as a next epoch's bet."""
        if self._cur is None and self._ahead is None and self.plan.windows:
            if self._direct is not None:  # a thread of its own that ends with the layout: a loader
                self._next_window += 1  # built and never iterated leaves no I/O threads behind
                self._ahead = _in_thread(self._lay_out, 0)
            else:
                self._ahead = self.io.submit(lambda: self._start(ahead=False))

    # --- batches ------------------------------------------------------------------------
    def batch(self, batch_index: int) -> dict[str, Any]:
        """The batch numbered `batch_index`; earlier ones of this slot not asked for are skipped."""
        while self._produced < len(self._numbers):
            number = self._numbers[self._produced]
            if number > batch_index:
                break
            parts = self._take(self.job.batch_size)
            self._produced += 1
            if number < batch_index:
                continue
            batch = self._builder.build(parts, self.numbers_before + number)
            # The next window's reads start once this batch is built, not before: they would share the
            # cores and the GIL with its gather (measured from S3: batch 0 came ~0.1 s after its window
            # was read, beside the next window's reads). Later batches wait at most one build for them.
            self._read_ahead()
            if batch_index == self._last:
                self.close()  # the slot is done: give its buffers back now
                self.finished = True
            return batch
        raise RuntimeError(f"internal: worker plan has no batch {batch_index} (it holds "
                           f"{self._numbers[:8]}...); please report this")

    def _take(self, num_samples: int) -> list[Part]:
        """The next num_samples of the plan as parts; a batch may straddle windows."""
        if self._direct is not None:
            return [self._direct.read(self._take_rows(num_samples))]
        parts: list[Part] = []
        self._carry.reset()
        while num_samples:
            w = self._cur
            if w is None or self._pos >= len(w.window.sample_ids):
                parts = [self._carry.carry(p) for p in parts]  # the old window's buffer is given back now
                w = self._advance()
            lo = self._pos
            hi = min(lo + num_samples, len(w.window.sample_ids))
            ids = w.window.sample_ids[lo:hi]
            rows = w.rows_of(ids)
            parts.append(Part(buf=w.buf, exts=w.exts, offsets=w.offsets[:, rows], sizes=w.sizes[:, rows],
                              ranks=w.ranks[:, rows], keys=w.keys[rows], ids=ids, mask=~w.window.is_pad[lo:hi],
                              shards=w.shard[rows], read_s=w.read_s * (hi - lo) / max(1, len(w.ids))))
            self._pos, num_samples = hi, num_samples - (hi - lo)
        return parts

    def _take_rows(self, num_samples: int) -> Rows:
        """The next num_samples of the plan, where they lie in their shards (direct: nothing read yet)."""
        rows: list[Rows] = []
        while num_samples:
            w = self._cur
            if w is None or self._pos >= len(w.window.sample_ids):
                w = self._advance()
            lo = self._pos
            hi = min(lo + num_samples, len(w.window.sample_ids))
            ids = w.window.sample_ids[lo:hi]
            r = w.rows_of(ids)
            d = w.direct
            assert d is not None
            rows.append(Rows(exts=w.exts, offsets=w.offsets[:, r], sizes=w.sizes[:, r], ranks=w.ranks[:, r],
                             keys=w.keys[r], ids=ids, mask=~w.window.is_pad[lo:hi], shards=w.shard[r],
                             positions=d["positions"][r], starts=d["starts"][r], ends=d["ends"][r],
                             sums=d["sums"][r], checked=d["checked"][r]))
            self._pos, num_samples = hi, num_samples - (hi - lo)
        return Rows.concat(rows)

    def close(self) -> None:
        """Cancel reads not started, wait for running ones (they write into our buffers), give buffers back."""
        if self._direct is not None:
            self._direct.close()
        if isinstance(self._ahead, Future):
            ahead, self._ahead = self._ahead, None
            if not ahead.cancel():
                with contextlib.suppress(Exception):  # the stream is being dropped
                    self._ahead = ahead.result()  # a window read ahead: its reads and buffer below
        for w in (self._ahead, self._cur):
            if w is None or w.buf is None:
                continue
            for f in w.reads:
                if not f.cancel():
                    with contextlib.suppress(Exception):  # the stream is being dropped
                        f.result()
            self.io.give(w.buf, ahead=w.ahead)
        self._ahead = self._cur = None


def _in_thread(fn: Any, *args: Any) -> Future:
    """fn(*args) in a new daemon thread; its Future."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - raised where the window is used
                future.set_exception(exc)

    threading.Thread(target=run, name=f"{IO_THREAD_PREFIX}-warm", daemon=True).start()
    return future


def all_local(reader: MixedReader) -> bool:
    """Whether every dataset's shards are local files read without a disk cache (raw_direct.py)."""
    return hasattr(os, "preadv") and all(r.store.is_local and r.cache is None for r in reader.readers)


def _load_indexes(shards: list[tuple[TarReader, int]], max_in_flight: int) -> None:
    """The (reader, shard)s' indexes (a HEAD and a GET each), fetched side by side: a window's start
    costs a round trip or two, not two per shard, and one slow request holds only its own shard."""
    unique = list({(id(reader), shard): (reader, shard) for reader, shard in shards}.values())
    if len(unique) > 1 and not all(reader.store.is_local for reader, _ in unique):  # local: no round trips
        with ThreadPoolExecutor(min(max_in_flight, len(unique)), thread_name_prefix=IO_THREAD_PREFIX) as pool:
            for f in [pool.submit(reader.index, shard) for reader, shard in unique]:
                f.result()
