"""What runs inside one DataLoader worker: its own plan, its own storage client, whole batches out.

The main process hands each worker small tickets ("batch k of iteration t, starting from plan
state S"); the worker computes its plan for its WorkerSlot with `plan_worker` (no shared memory,
no locks: every worker can compute its own), streams its windows' segments through a Prefetcher,
and assembles batches per the contract in dataio/batch.py. Everything here is picklable, so the
`spawn` start method works: the Store opens its fsspec client lazily inside the worker.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.format.manifest import Manifest
from dataio.loader.collate import HEDGES_KEY, assemble, hedges_since_last_batch
from dataio.loader.raw import RawIo, RawStream, all_local, process_io, raw_fast_path
from dataio.loader.slabs import SlabRing
from dataio.plan.mix import MixState, Mixture, plan_mix_worker
from dataio.plan.plan import plan_worker
from dataio.plan.types import PlanConfig, PlanState, Segment, Topology
from dataio.readers.base import split_segment
from dataio.readers.by_format import make_reader
from dataio.readers.mixed import MixedReader
from dataio.readers.tar import zero_copy
from dataio.storage.cache import DiskCache
from dataio.storage.prefetch import Prefetcher
from dataio.storage.store import Store


@dataclass(frozen=True, slots=True)
class Ticket:
    """One unit of work the main process sends: batch `batch_index` of iteration `token`."""

    token: int
    plan_state: PlanState  # where the iteration starts
    batch_index: int  # rank-level batch number counted from that state's position
    released_below: int = 0  # batches of this iteration the caller has moved past (slabs.py)
    # Batches below `head` are made in the main process (first_batch.py): a ticket for one returns
    # None at once, and its slot's stream skips them without reading or decoding them.
    head: int = 0
    # Only open the slot's stream from plan_state and read its first window (a bet the next
    # iteration starts there, as when the loader is built); returns None.
    warm: bool = False


@dataclass(frozen=True, kw_only=True)
class WorkerJob:
    """Everything a worker needs, picklable; built once in the main process."""

    store: Store
    manifest: Manifest
    plan_config: PlanConfig
    topology: Topology
    batch_size: int
    fields: tuple[str, ...] | None
    verify_index: bool
    verify_checksums: bool
    decode: str | None  # "cpu", "dali" or None (dali decodes in the main process)
    decode_config: DecodeConfig | None
    image_fields: tuple[str, ...]  # a sample's image: the first of these it has (IMAGE_FIELD_ORDER)
    transform: Callable[..., Any] | None
    collate: Callable[[list[dict[str, Any]]], Any] | None
    on_corrupt: str
    prefetch_bytes: int
    max_in_flight: int
    cache_dir: str | None
    cache_limit_bytes: int | None
    slice_bytes: int | None = None  # Parquet row groups bigger than this (the window budget) are read in slices
    # A mixture (plan/mix.py): every source's store, manifest and reader projection (store,
    # manifest and fields above are the first's), and each source's label field; None: one dataset.
    mixture: Mixture | None = None
    sources: tuple[tuple[Store, Manifest, tuple[str, ...] | None], ...] = ()
    label_fields: tuple[str, ...] = ()
    reuse_buffers: bool = False  # pack raw bytes into this process's SlabRing (slabs.py)


_MALLOC_TUNED = False


def return_freed_buffers() -> None:
    """In a DataLoader worker, make glibc give multi-MB read buffers back to the system when freed.

    Every ranged read returns a fresh bytes object of several MB, allocated in the prefetch
    threads' arenas. glibc's adaptive threshold soon serves such sizes from those arenas, which
    then fragment and keep growing over an epoch (measured: one reader's RSS crept ~350 MB above
    its window + prefetch budget on a 40k-sample epoch). A fixed 1 MB mmap threshold keeps memory
    at the budget, for the price of page faults on each read.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED or torch.utils.data.get_worker_info() is None:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD, fixed (no adaptive raise)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator decides


class BatchDataset(torch.utils.data.Dataset):
    """A map-style dataset over tickets: `ds[ticket]` is one whole batch (a dict per the contract)."""

    def __init__(self, job: WorkerJob, io: RawIo | None = None, *, decode_threads: int = 1) -> None:
        self.job = job
        self.decode_threads = decode_threads  # threads decoding one batch (first_batch.py: the main process's)
        # RAW streams' I/O threads and window buffers: shared by the reader threads of a process
        # (given), else this process's own (made when first needed).
        self._io, self._own_io = io, io is None
        self._reader: Any = None
        self._decoder: Any = None
        self._token = -1
        self._streams: dict[int, WorkerStream | RawStream] = {}
        # A stream read ahead on a bet: ((plan state, head), slot, stream).
        self._spare: tuple[tuple[PlanState, int], int, WorkerStream | RawStream] | None = None
        self._slabs: SlabRing | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"job": self.job}  # readers, prefetch threads and decoders are per process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["job"])  # type: ignore[misc]

    def __len__(self) -> int:  # not used by the DataLoader (the sampler has the length)
        return 0

    def __getitem__(self, ticket: Ticket) -> dict[str, Any]:
        if self._pid != os.getpid():
            # Forked workers inherit this object without pickling: drop the parent's clients
            # (s3fs refuses to cross a fork) and open fresh ones here.
            self.__init__(self.job)  # type: ignore[misc]
        if self._token == -1:
            return_freed_buffers()
        if ticket.token != self._token:
            self._close_streams()
            self._token = ticket.token
            self._adopt_spare((ticket.plan_state, ticket.head))
        # Batch k belongs to worker k % num_workers; torch hands tickets out round-robin, so this
        # is normally our own slot. Should that ever differ, the owner's stream is replayed here.
        worker_id = self.job.topology.worker_of(ticket.batch_index)
        if ticket.warm:
            self._bet(worker_id, ticket.plan_state, ticket.head)
            return None  # type: ignore[return-value]
        stream = self._streams.get(worker_id)
        if stream is None:
            stream = self._stream(worker_id, ticket.plan_state, ticket.head)
            self._streams[worker_id] = stream
        if ticket.batch_index < ticket.head:
            return None  # type: ignore[return-value]  # the main process made it; the stream skips it
        if self.job.reuse_buffers:
            if self._slabs is None:
                self._slabs = SlabRing(shared=torch.utils.data.get_worker_info() is not None)
            with self._slabs.serving(ticket.token, ticket.batch_index, ticket.released_below):
                batch = stream.batch(ticket.batch_index)
        else:
            batch = stream.batch(ticket.batch_index)
        if stream.finished:
            self._start_spare(stream, worker_id)
        return batch

    def _start_spare(self, finished: WorkerStream | RawStream, worker_id: int) -> None:
        """Start reading this slot's next epoch in the background, betting on `set_epoch(e + 1)`.

        Persistent workers are otherwise idle between epochs, and every epoch would begin by
        reading a whole shuffle window. Only inside DataLoader workers.
        """
        self._bet(worker_id, PlanState(epoch=finished.epoch + 1), getattr(finished, "head", 0))

    def bet_in_process(self, state: PlanState) -> None:
        """num_workers=0, RAW from local files: open slot 0's stream from `state` now (the loader is
        being built) and lay out its first window in a thread; the first iteration that starts
        there adopts it (see `_bet`). Object storage waits for the iteration: its reads would keep
        I/O threads (and requests) alive for a loader that may never be iterated."""
        if raw_fast_path(self.job) and all_local(self.reader):
            self._bet(0, state, 0, in_process=True)

    def _bet(self, worker_id: int, state: PlanState, head: int, *, in_process: bool = False) -> None:
        """Open this slot's stream from `state` and read its first window in the background; a bet
        that loses (another epoch, a loaded state, another head) is dropped when the next
        iteration's first ticket shows it. Inside DataLoader workers, or `in_process`."""
        if self._spare is not None or (torch.utils.data.get_worker_info() is None and not in_process):
            return
        stream = self._stream(worker_id, state, head)
        stream.warm_up()
        self._spare = ((state, head), worker_id, stream)

    def _adopt_spare(self, start: tuple[PlanState, int] | None) -> None:
        spare, self._spare = self._spare, None
        if spare is None:
            return
        bet, worker_id, stream = spare
        if bet == start:
            self._streams[worker_id] = stream
        else:
            stream.close()

    def _stream(self, worker_id: int, state: PlanState, head: int = 0) -> WorkerStream | RawStream:
        if raw_fast_path(self.job):
            assert head == 0, "the first batch is made in the main process only with decode='cpu'"
            if self._io is None:
                self._io = process_io(self.job, num_streams=1)
            return RawStream(self, worker_id, state, self._io)
        return WorkerStream(self, worker_id, state, batches=(head, None))

    def _close_streams(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def close(self) -> None:
        self._close_streams()
        self._adopt_spare(None)  # drops the spare
        if self._own_io and self._io is not None:
            self._io.close()  # its I/O threads; the buffers stay for the next iteration

    # --- per-process lazies -------------------------------------------------------------
    @property
    def reader(self) -> Any:
        if self._reader is None:
            cache = None
            if self.job.cache_dir is not None:
                cache = DiskCache(self.job.cache_dir, limit_bytes=self.job.cache_limit_bytes)
            job = self.job
            readers = [
                make_reader(Store(store.raw_url, store.options, store.retry), manifest, fields=fields,
                            verify_index=job.verify_index, cache=cache, slice_bytes=job.slice_bytes,
                            verify_checksums=job.verify_checksums)
                for store, manifest, fields in (job.sources or ((job.store, job.manifest, job.fields),))
            ]
            if job.mixture is None:
                self._reader = readers[0]
            else:  # one reader over all sources: global segments in, samples with __source__ out
                self._reader = MixedReader(readers, [m for _, m, _ in job.sources], label_fields=job.label_fields)
        return self._reader

    def split(self, seg: Segment) -> list[Any]:
        """A window's segment as the pieces the reader fetches."""
        if self.job.mixture is not None:
            return self.reader.split_segment(seg)
        return split_segment(seg, self.job.manifest)

    @property
    def decoder(self) -> Any:
        if self._decoder is None:
            self._decoder = CpuDecoder(self.job.decode_config, transform=self.job.transform,
                                       num_threads=self.decode_threads)
        return self._decoder


class WorkerStream:
    """The batches of one WorkerSlot for one iteration, produced front to back with prefetch.

    `batches=(lo, hi)` makes only the slot's batches numbered in [lo, hi) (hi None: to the end):
    windows holding none of them are never read, and samples of the others are not decoded. The
    main process makes an iteration's first batch with (0, 1) and worker 0 the rest with (1, None)
    (first_batch.py); both see the same plan, so the batches are those of one stream (0, None).
    """

    def __init__(self, owner: BatchDataset, worker_id: int, state: PlanState,
                 batches: tuple[int, int | None] = (0, None)) -> None:
        job = owner.job
        self.owner = owner
        slot = job.topology.slot(worker_id)
        self.epoch = state.epoch
        # batch_number counts rank-level batches from the epoch's start, across earlier topologies.
        self.numbers_before = sum(p.batches for p in state.progress)
        if job.mixture is not None:
            mix_state = MixState(plan=state, mixture=job.mixture.describe())
            self.plan = plan_mix_worker(job.mixture, config=job.plan_config, slot=slot, state=mix_state)
        else:
            self.plan = plan_worker(job.manifest.shard_num_samples, config=job.plan_config, slot=slot, state=state)
        self._prefetcher: Any = None
        self.head = batches[0]
        self._select(*batches)
        self._last = int(self._numbers[-1]) if len(self._numbers) else -1
        self._window_iter = self._windows()
        self._batches = self._generate()
        self._warm: threading.Thread | None = None
        self._head: list[Any] = []  # the first window (or its exception), read by warm_up
        self.finished = False

    def _select(self, lo: int, hi: int | None) -> None:
        """The batch numbers to make, the windows to read for them, and where those start and stop
        in the slot's delivery order (positions counted in samples, padding included)."""
        numbers, size = self.plan.batch_numbers, self.owner.job.batch_size
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
        reader = self.owner.reader
        job = self.owner.job
        # (window number, piece): a window is shuffled only once all its pieces are in, so its
        # pieces are taken as they arrive and one straggling read does not hold the rest.
        pieces = [[(w, p) for seg in window.segments for p in self.owner.split(seg)]
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

    def _all_windows(self) -> Iterator[tuple[Any, dict[int, dict[str, Any]], float]]:
        self._join()
        head, self._head = self._head, []
        if head and isinstance(head[0], BaseException):
            raise head[0]
        if head and head[0] is not None:
            yield head[0]
        yield from self._window_iter

    def _generate(self) -> Iterator[tuple[int, dict[str, Any]]]:
        job = self.owner.job
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

    def _assemble(self, pending: list[tuple[dict[str, Any], bool]], number: int, read_s: float) -> dict[str, Any]:
        samples = [s for s, _ in pending]
        mask = [not p for _, p in pending]
        batch = assemble(self.owner, samples, mask, epoch=self.epoch, batch_number=number, read_s=read_s)
        if isinstance(batch, dict):
            batch[HEDGES_KEY] = hedges_since_last_batch()
        return batch
