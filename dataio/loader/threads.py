"""num_workers reader threads in the main process, in place of DataLoader worker processes.

Thread i runs exactly the WorkerSlot stream that DataLoader worker i would run (its own
BatchDataset, so its own reader and decoder), on the tickets worker i would get: batches i, i + n,
i + 2n... The caller takes them round robin, batch k from thread k % n, which is the order the
DataLoader delivers; so the sample order, the pixels, state_dict and resume are those of the
process mode, bit for bit.
Why threads: a RAW batch is file reads and large copies, and a decode="cpu" batch is libjpeg,
torch's resize and the planes copy, all of which release the GIL (~12 us of Python per image
holds it). One process spares the batch's trip through shared memory, a fresh shared-memory
batch per batch (its page faults: ~85 us per 224x224 image; threads take the images from the
StoragePool, slabs.py), the workers' start-up and their memory, and lets RAW threads share one
prefetch budget (stream/raw_io.py).

A thread's error is raised in the caller, as the same exception (its message names the URL and
sample key); stopping the iteration (its end, `break`, an error, `close()`) stops and joins
every thread. `pin_memory=True` pins the batch's tensors in the caller's thread, as the
DataLoader's pinning thread would (PackedBytes are left as they are, see slabs.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

from dataio.plan.types import PlanState
from dataio.stream.job import Ticket, WorkerJob
from dataio.stream.raw_io import process_io
from dataio.stream.worker import BatchDataset, return_freed_buffers

THREAD_PREFIX = "dataio-reader"
_POLL_S = 0.1  # how often a blocked thread or the caller looks whether the iteration stopped


class ReaderThreads:
    """Batches of one loader from `num_workers` threads; `iterate` once per iteration."""

    def __init__(self, job: WorkerJob, *, num_workers: int, prefetch_factor: int, pin_memory: bool) -> None:
        # RAW streams share one process's I/O threads and window buffers; decoding streams read
        # through their own Prefetcher (each its read-ahead budget, as each worker process has).
        self.io = process_io(job, num_streams=num_workers) if job.stream == "raw" else None
        if self.io is None:
            return_freed_buffers(in_threads=True)  # the worker processes' malloc tuning, here
        self.datasets = [BatchDataset(job, io=self.io) for _ in range(num_workers)]
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def iterate(self, token: int, plan_state: PlanState, steps: int, released: Any) -> Iterator[Any]:
        """Batches 0..steps-1 of the iteration `token` from `plan_state`, in order; `released()` is
        the number the caller has moved past (tickets carry it, slabs.py)."""
        self.stop()
        n = len(self.datasets)
        # prefetch_factor batches ready in all (not per thread: the threads share one process).
        depth = max(1, -(-self.prefetch_factor // n))
        queues: list[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(n)]
        stop = self._stop = threading.Event()

        def run(i: int) -> None:
            try:
                for k in range(i, steps, n):
                    if stop.is_set():
                        return
                    batch = self.datasets[i][Ticket(token, plan_state, k, released())]
                    if not _put(queues[i], (True, batch), stop):
                        return
            except BaseException as exc:  # noqa: BLE001 - raised in the caller, at its batch
                _put(queues[i], (False, exc), stop)

        self._threads = [threading.Thread(target=run, args=(i,), name=f"{THREAD_PREFIX}-{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()
        return self._deliver(queues, steps, stop)

    def _deliver(self, queues: list[queue.Queue], steps: int, stop: threading.Event) -> Iterator[Any]:
        n = len(queues)
        try:
            for k in range(steps):
                ok, value = _get(queues[k % n], self._threads[k % n], stop)
                if not ok:
                    raise value
                if self.pin_memory:
                    from torch.utils.data._utils.pin_memory import pin_memory

                    value = pin_memory(value)
                yield value
        finally:
            if stop is self._stop:
                self.stop()

    def stop(self) -> None:
        """Stop the iteration's threads and join them; close their streams (buffers back to the pool)."""
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []
        for ds in self.datasets:
            ds.close()
        if self.io is not None:
            self.io.close()

    close = stop


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _get(q: queue.Queue, thread: threading.Thread, stop: threading.Event) -> tuple[bool, Any]:
    while True:
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            if stop.is_set():
                return False, RuntimeError("this loader started a newer iteration; an old iterator cannot continue")
            if not thread.is_alive() and q.empty():
                return False, RuntimeError(f"internal: reader thread {thread.name} ended early; please report this")
