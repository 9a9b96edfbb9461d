"""Each iteration's first batch, made in the main process while the worker processes start (the
execution plan's first_batch="main": loader/execution.py decides when).

With worker processes, a first batch used to wait for them to be forked (at the first next()),
then for worker 0 to decode it on one core while worker 1 decoded the second batch on the other,
then for it to cross to the main process. Now (early_start=True, decode='cpu') the workers are
started when the loader is built, each reading its first window, and the main process makes the
first batch itself: it reads plan slot 0's first window and decodes it with num_workers threads
(CpuDecoder's threads; simplejpeg and torch's resize release the GIL), so both cores decode batch
0 before any other. Only then do the workers get their tickets (worker_of(0) gets a None for
batch 0, its stream skips that window unread), and they decode the next batches while the caller
uses the first.

The order never changes: the main process runs slot 0's own stream limited to batch 0 and worker
0 runs the same stream from batch 1 (WorkerStream's `batches`), so the batches are bit for bit
those of the workers alone. The hand-over is at a fixed position, batch 0 of each iteration, and
only when slot 0's first windows hold that batch alone (a fresh epoch; not a resume inside a
larger window, which would be read twice): otherwise the workers make every batch, as before.

Reader threads (worker_mode="threads") do not take this path: it exists to hide the worker
processes' start-up, and threads have none (no fork, no imports, no pipe); thread 0 decodes batch
0 on one core while thread 1 decodes batch 1 (measured: 0.27-0.30 s to the first batch of 256,
as with processes and this path, 0.23-0.29 s, on 2 shared cores).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dataio.plan.types import PlanState
from dataio.stream.decoded import WorkerStream
from dataio.stream.job import WorkerJob
from dataio.stream.worker import BatchDataset


class FirstBatch:
    """Makes batch 0 of an iteration from plan slot 0's stream in this process, decoding with
    `num_threads` threads; `head(state)` says whether it will (1) or the workers make it (0)."""

    def __init__(self, job: WorkerJob, *, num_threads: int) -> None:
        assert job.decode_at == "worker" and job.transform is None and job.collate is None and not job.reuse_buffers
        self._dataset = BatchDataset(job, decode_threads=num_threads)
        self._state: PlanState | None = None
        self._stream: WorkerStream | None = None  # slot 0's stream from _state, batch 0 only
        self.made = 0  # first batches made here so far
        self._sender: _InThread | None = None  # the thread sending the workers' tickets, the last one started

    def head(self, state: PlanState) -> int:
        """Batches the main process makes at the start of an iteration from `state`: 1 when slot
        0's first windows hold its first batch and nothing else, else 0 (the workers make it)."""
        return 1 if self._open(state) is not None else 0

    def warm_up(self, state: PlanState) -> None:
        """Start reading the first batch's window in a background thread (decoding waits for make)."""
        stream = self._open(state)
        if stream is not None:
            stream.warm_up()

    def make(self, state: PlanState) -> dict[str, Any]:
        """Batch 0 of the iteration from `state` (head(state) must be 1), decoded here."""
        stream = self._open(state)
        assert stream is not None, "make() without a head"
        self._state, self._stream = None, None  # used once: the stream closes itself after its batch
        try:
            batch = stream.batch(0)
            self.made += 1
            return batch
        finally:
            if not stream.finished:  # it raised (a corrupt sample): stop its reads here
                stream.close()

    def then_workers(self, start: PlanState, head: int, dataloader: Any, *, pin_memory: bool,
                     is_current: Callable[[], bool]) -> Iterator[Any]:
        """The iteration's first batch made here with every core, then the workers' batches.

        The workers get their tickets only once it is made, from a thread so that the first batch
        does not wait for them: torch's DataLoader waits until every worker is up (milliseconds
        after a fork, seconds after a spawn) before it sends any ticket. `is_current()` is False
        once the loader has started a newer iteration, which took the DataLoader over.
        """
        first = self.make(start)
        if self._sender is not None:  # an earlier iteration left unfinished, its tickets maybe still going out
            self._sender.join()
        sender = self._sender = _InThread(lambda: iter(dataloader))
        try:
            yield _pinned(first) if pin_memory else first
        except GeneratorExit:  # the caller left after the first batch
            sender.join()  # the DataLoader iterator is used by one thread at a time
            raise
        batches = sender.result()
        if not is_current():
            raise RuntimeError("this loader started a newer iteration; an old iterator cannot continue")
        for _ in range(head):
            next(batches)  # worker 0's None for the batch made here
        yield from batches

    def _open(self, state: PlanState) -> WorkerStream | None:
        if self._state != state:
            self.close()
            stream = WorkerStream(self._dataset.opened, 0, state, batches=(0, 1))
            if stream.reads_only_its_batches:
                self._stream = stream
            else:
                stream.close()
            self._state = state
        return self._stream

    def close(self) -> None:
        """Stop the stream's reads (a bet on a state the iteration did not start from)."""
        if self._sender is not None:
            self._sender.join()
        if self._stream is not None:
            self._stream.close()
        self._state, self._stream = None, None
        self._dataset.close()


def _pinned(batch: Any) -> Any:
    """A batch made in this process, pinned as the DataLoader pins the workers' ones."""
    if not torch.accelerator.is_available():
        return batch
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch)


class _InThread:
    """fn() run in a thread started now; result() waits for it and returns (or raises) its outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._outcome: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                self._outcome.append((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - raised again by result()
                self._outcome.append((False, exc))

        self._thread = threading.Thread(target=run, name="dataio-first-tickets", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value
