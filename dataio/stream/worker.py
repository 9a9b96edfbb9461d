"""What runs inside one DataLoader worker: its own plan, its own storage client, whole batches out.

The main process hands each worker small tickets ("batch k of iteration t, starting from plan
state S"); the worker computes its plan for its WorkerSlot (WorkerJob.plan: no shared memory, no
locks: every worker can compute its own) and runs its slot's stream: decoded.py (sample dicts)
or raw.py (RAW tar bytes), whole batches per the contract in dataio/batch.py. Everything here is
picklable, so the `spawn` start method works: the Store opens its fsspec client lazily inside
the worker.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from dataio.batch import M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, glibc_mallopt
from dataio.plan.types import PlanState
from dataio.stream.decoded import WorkerStream
from dataio.stream.job import OpenJob, Ticket, WorkerJob
from dataio.stream.raw import RawStream, all_local, raw_fast_path
from dataio.stream.raw_io import RawIo, process_io
from dataio.stream.slabs import SlabRing

_MALLOC_TUNED = False


def return_freed_buffers(*, in_threads: bool = False) -> None:
    """In a DataLoader worker (or, `in_threads`, a process whose reader threads decode: the same
    reads and decodes, moved there), make glibc give multi-MB read buffers back when freed.

    Every ranged read returns a fresh bytes object of several MB, allocated in the prefetch
    threads' arenas. glibc's adaptive threshold soon serves such sizes from those arenas, which
    then fragment and keep growing over an epoch (measured: one reader's RSS crept ~350 MB above
    its window + prefetch budget on a 40k-sample epoch). A fixed 1 MB mmap threshold keeps memory
    at the budget, for the price of page faults on each read (measured with 2 decoding reader
    threads: peak PSS 533 MiB instead of 597, the same CPU time).
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED or (not in_threads and torch.utils.data.get_worker_info() is None):
        return
    _MALLOC_TUNED = True
    glibc_mallopt((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))  # fixed (no adaptive raise)


class BatchDataset(torch.utils.data.Dataset):
    """A map-style dataset over tickets: `ds[ticket]` is one whole batch (a dict per the contract)."""

    def __init__(self, job: WorkerJob, io: RawIo | None = None, *, decode_threads: int = 1) -> None:
        self.job = job
        self.opened = OpenJob(job, decode_threads=decode_threads)  # this process's reader and decoder
        # RAW streams' I/O threads and window buffers: shared by the reader threads of a process
        # (given), else this process's own (made when first needed).
        self._io, self._own_io = io, io is None
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
        self.opened.ship_raw = ticket.raw  # decode="auto": this batch goes to the GPU undecoded
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
        self._bet(worker_id, finished.state.next_epoch(finished.epoch + 1), getattr(finished, "head", 0))

    def bet_in_process(self, state: PlanState) -> None:
        """num_workers=0, RAW from local files: open slot 0's stream from `state` now (the loader is
        being built) and lay out its first window in a thread; the first iteration that starts
        there adopts it (see `_bet`). Object storage waits for the iteration: its reads would keep
        I/O threads (and requests) alive for a loader that may never be iterated."""
        if raw_fast_path(self.job) and all_local(self.opened.reader):
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
            return RawStream(self.opened, worker_id, state, self._io)
        return WorkerStream(self.opened, worker_id, state, batches=(head, None))

    def _close_streams(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def close(self) -> None:
        self._close_streams()
        self._adopt_spare(None)  # drops the spare
        if self._own_io and self._io is not None:
            self._io.close()  # its I/O threads; the buffers stay for the next iteration
