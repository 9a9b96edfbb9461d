"""The decoded stream: one WorkerSlot's batches of sample dicts for one iteration, with prefetch.

Its windows' pieces are fetched through a Prefetcher by the job's reader, parsed into samples,
and every `batch_size` of them assembled into a batch (collate.py) in the plan's order; a
window's samples are freed once it is delivered. RAW tar batches go through raw.py instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from dataio.plan.types import PlanState
from dataio.readers.tar import zero_copy
from dataio.storage.prefetch import Prefetcher
from dataio.stream.by_sample import BatchRead, SampleReads, batch_ids, batch_reads
from dataio.stream.collate import HEDGES_KEY, assemble, hedges_since_last_batch
from dataio.stream.job import OpenJob


class WorkerStream:
    """The batches of one WorkerSlot for one iteration, produced front to back with prefetch.

    `batches=(lo, hi)` makes only the slot's batches numbered in [lo, hi) (hi None: to the end):
    windows holding none of them are never read, and samples of the others are not decoded. The
    main process makes an iteration's first batch with (0, 1) and worker 0 the rest with (1, None)
    (first_batch.py); both see the same plan, so the batches are those of one stream (0, None).
    """

    def __init__(self, opened: OpenJob, worker_id: int, state: PlanState,
                 batches: tuple[int, int | None] = (0, None)) -> None:
        self.opened = opened
        self.epoch = state.epoch
        self.state = state  # where it started: the next epoch's bet keeps its skip list
        # batch_number counts rank-level batches from the epoch's start, across earlier topologies.
        self.numbers_before = sum(p.batches for p in state.progress)
        self.plan = opened.job.plan(worker_id, state)
        self._prefetcher: Any = None
        self.head = batches[0]
        self._select(*batches)
        self._last = int(self._numbers[-1]) if len(self._numbers) else -1
        # Local tar shards: each batch's samples read in its turn (by_sample.py), not whole windows.
        self.by_sample = opened.job.stream == "by_sample"
        if self.by_sample:
            self.reads_only_its_batches = bool(len(self._numbers))
        self._window_iter = self._batch_reads() if self.by_sample else self._windows()
        self._batches = self._generate()
        self._warm: threading.Thread | None = None
        self._head: list[Any] = []  # the first window (or its exception), read by warm_up
        self.finished = False

    def _select(self, lo: int, hi: int | None) -> None:
        """The batch numbers to make, the windows to read for them, and where those start and stop
        in the slot's delivery order (positions counted in samples, padding included)."""
        numbers, size = self.plan.batch_numbers, self.opened.job.batch_size
        first = int(np.searchsorted(numbers, lo))  # the slot's batches before lo: not made
        last = len(numbers) if hi is None else int(np.searchsorted(numbers, hi))
        self._numbers = numbers[first:last]
        self._skip, self._stop = first * size, last * size  # positions [skip, stop) make the batches
        ends = np.cumsum([len(w.sample_ids) for w in self.plan.windows], dtype=np.int64)
        starts = ends - np.asarray([len(w.sample_ids) for w in self.plan.windows], dtype=np.int64)
        kept = [i for i in range(len(ends)) if starts[i] < self._stop and ends[i] > self._skip]
        self._kept = [self.plan.windows[i] for i in kept]
        self._start = int(starts[kept[0]]) if kept else 0  # position of the first kept window's first sample
        # The windows read hold these batches' samples and nothing else (none read for nothing).
        self.reads_only_its_batches = bool(kept) and self._start == self._skip and int(ends[kept[-1]]) == self._stop

    def warm_up(self) -> None:
        """Read the first window in a background thread; decoding waits for the batch's ticket."""

        def first() -> None:
            try:
                self._head.append(next(self._window_iter, None))
            except BaseException as exc:  # noqa: BLE001 - raised where the batch is asked for
                self._head.append(exc)

        self._warm = threading.Thread(target=first, name="dataio-next-epoch", daemon=True)
        self._warm.start()

    def _join(self) -> None:
        if self._warm is not None:
            self._warm.join()
            self._warm = None

    def batch(self, batch_index: int) -> dict[str, Any]:
        """The batch numbered `batch_index`; earlier ones of this slot not asked for are skipped."""
        self._join()
        for number, batch in self._batches:
            if number == batch_index:
                if batch_index == self._last:
                    self.close()  # the slot is done: stop its prefetch threads now
                    self.finished = True
                return batch
            if number > batch_index:
                break
        raise RuntimeError(
            f"internal: worker plan has no batch {batch_index} (it makes "
            f"{self._numbers.tolist()[:8]}...); please report this"
        )

    def close(self) -> None:
        self._join()  # the generator may only be closed by one thread, when it is not running
        self._head = []
        self._batches.close()
        self._window_iter.close()
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def _windows(self) -> Iterator[tuple[Any, dict[int, dict[str, Any]], float]]:
        """(window, samples by global id, seconds spent reading and parsing it), in plan order."""
        reader = self.opened.reader
        job = self.opened.job
        # (window number, piece): a window is shuffled only once all its pieces are in, so its
        # pieces are taken as they arrive and one straggling read does not hold the rest.
        pieces = [[(w, p) for seg in window.segments for p in self.opened.split(seg)]
                  for w, window in enumerate(self._kept)]
        # The first window's reads first, alone: reading ahead ramps up from there (prefetch.py).
        first = sum(reader.payload_bytes(p) for _, p in pieces[0]) if pieces else 0
        self._prefetcher = Prefetcher(
            lambda r: reader.fetch(r[1]), size_of=lambda r: reader.payload_bytes(r[1]),
            budget_bytes=job.prefetch_bytes, max_in_flight=job.max_in_flight, first_budget_bytes=max(1, first),
        )
        results = iter(self._prefetcher.run((r for w in pieces for r in w), group=lambda r: r[0]))
        for window, window_pieces in zip(self._kept, pieces):
            by_id: dict[int, dict[str, Any]] = {}
            read_s = 0.0
            for _ in window_pieces:
                (_, piece), payload, fetch_s = next(results)
                start = time.perf_counter()
                for sample in reader.parse(piece, zero_copy(payload)):
                    by_id[int(sample["__id__"])] = sample
                read_s += fetch_s + time.perf_counter() - start
            yield window, by_id, read_s

    def _batch_reads(self) -> Iterator[BatchRead]:
        """((ids, pads), samples, seconds reading them) per batch to make, read ahead (by_sample.py)."""
        reads = SampleReads(self.opened)
        batches = batch_ids(self._kept, start=self._start, skip=self._skip, stop=self._stop,
                            batch_size=self.opened.job.batch_size, entering=reads.will_need)
        self._prefetcher, batch_samples = batch_reads(reads, batches)
        try:
            yield from batch_samples
        finally:
            self._prefetcher.close()  # its thread joined: the files are no longer read
            reads.close()

    def _all_windows(self) -> Iterator[Any]:
        self._join()
        head, self._head = self._head, []
        if head and isinstance(head[0], BaseException):
            raise head[0]
        if head and head[0] is not None:
            yield head[0]
        yield from self._window_iter

    def _generate(self) -> Iterator[tuple[int, dict[str, Any]]]:
        if self.by_sample:
            yield from self._generate_by_batch()
            return
        job = self.opened.job
        numbers = self._numbers.tolist()
        pending: list[tuple[dict[str, Any], bool]] = []
        pending_read_s = 0.0
        produced = 0
        position = self._start  # in the slot's delivery order; [_skip, _stop) make our batches
        for window, by_id, read_s in self._all_windows():
            ids = window.sample_ids.tolist()
            pads = window.is_pad.tolist()
            per_sample_s = read_s / max(1, len(ids))  # a window's reading cost, shared by its samples
            for sample_id, is_pad in zip(ids, pads):
                position += 1
                if not self._skip < position <= self._stop:
                    continue  # a batch made by another stream (the main process's first batch)
                pending.append((by_id[sample_id], is_pad))
                pending_read_s += per_sample_s
                if len(pending) == job.batch_size:
                    number = numbers[produced]
                    yield number, self._assemble(pending, self.numbers_before + number, pending_read_s)
                    produced += 1
                    pending, pending_read_s = [], 0.0
            # Windows hold whole batches: this one is delivered. Free its samples (and the payloads
            # their views keep alive) now, not after the next window has been read beside it.
            by_id.clear()
        assert not pending and produced == len(numbers), "plan windows must hold whole batches"

    def _generate_by_batch(self) -> Iterator[tuple[int, dict[str, Any]]]:
        numbers = self._numbers.tolist()
        produced = 0
        for (_, pads), samples, read_s in self._all_windows():
            number = numbers[produced]
            batch = self._assemble(list(zip(samples, pads)), self.numbers_before + number, read_s)
            # Free the batch's bytes now, not when the next batch is asked for: the read-ahead's
            # generator holds this list until then (while the batch travels and the next is read).
            samples.clear()
            yield number, batch
            del batch
            produced += 1
        assert produced == len(numbers), "plan windows must hold whole batches"

    def _assemble(self, pending: list[tuple[dict[str, Any], bool]], number: int, read_s: float) -> dict[str, Any]:
        samples = [s for s, _ in pending]
        mask = [not p for _, p in pending]
        batch = assemble(self.opened, samples, mask, epoch=self.epoch, batch_number=number, read_s=read_s)
        if isinstance(batch, dict):
            batch[HEDGES_KEY] = hedges_since_last_batch()
        return batch
