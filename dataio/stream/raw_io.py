"""What the RAW streams of one process share (raw.py): I/O threads, window buffers, index columns.

A stream holds one window buffer for the window it serves, plus at most one of `spares` shared by
the whole process for reading its next window ahead: one prefetch_bytes budget for all the reader
threads of a process, not one per stream. Buffers are reused, so their pages fault once.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dataio.readers.base import LruCache, nbytes_of
from dataio.readers.tar import INDEX_CACHE_BYTES, INDEX_CACHE_SHARDS
from dataio.stream.job import WorkerJob

IO_THREAD_PREFIX = "dataio-raw-io"
GROWTH = 1.125  # a new window buffer has room for windows this much larger than the one that asked


def spare_windows(job: WorkerJob, num_streams: int) -> int:
    """Window buffers for reading ahead, one prefetch_bytes budget for all of a process's streams:
    the whole windows that fit in it, at most one per stream. A lone stream (a worker process,
    num_workers=0) always gets one, or it would stop at every window; reader threads share the
    budget, and where no window fits, a thread reading its next window is covered by the others'."""
    fit = job.prefetch_bytes // job.window_bytes()
    return min(num_streams, max(1 if num_streams == 1 else 0, fit))


class RawIo:
    """What the RAW streams of one process share: I/O threads, window buffers, index columns.

    A stream holds one buffer for the window it serves (never waits for it) and at most one more
    for the next window, taken only while fewer than `spares` are out: memory is
    (streams + spares) windows, and no stream can starve another.
    """

    def __init__(self, *, max_in_flight: int, spares: int, min_bytes: int = 0, lone: bool = False) -> None:
        # New buffers have room for a full window at once (min_bytes): windows that grow from one
        # batch (plan v2) then fill the same buffer, and only the pages written are ever touched.
        self.max_in_flight, self.spares, self.min_bytes = max_in_flight, spares, min_bytes
        self.lone = lone  # one stream in this process: its direct reads may use an I/O thread
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._ahead = 0
        self._pool: ThreadPoolExecutor | None = None
        self.columns = LruCache(INDEX_CACHE_SHARDS, max_bytes=INDEX_CACHE_BYTES, size_of=nbytes_of)

    def submit(self, fn: Any, *args: Any) -> Future:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix=IO_THREAD_PREFIX)
            return self._pool.submit(fn, *args)

    def take(self, num_bytes: int, *, ahead: bool) -> np.ndarray | None:
        """A buffer of at least num_bytes (contents undefined); None when reading ahead is over budget."""
        with self._lock:
            if ahead:
                if self._ahead >= self.spares:
                    return None
                self._ahead += 1
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= num_bytes]
            if fits:  # the smallest that fits (a list of arrays: by position, never by ==)
                return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            if self._free:  # all too small: drop the largest, a bigger one takes its place
                self._free.pop(max(range(len(self._free)), key=lambda i: self._free[i].nbytes))
        return np.empty(max(self.min_bytes, int(num_bytes * GROWTH)), dtype=np.uint8)

    def promote(self) -> None:
        """A buffer read ahead becomes its stream's current one (no longer counts as a spare)."""
        with self._lock:
            self._ahead -= 1

    def give(self, buf: np.ndarray, *, ahead: bool = False) -> None:
        with self._lock:
            if ahead:
                self._ahead -= 1
            self._free.append(buf)

    def close(self) -> None:
        """Stop the I/O threads (started again on the next read); buffers stay for reuse."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)




def process_io(job: WorkerJob, num_streams: int) -> RawIo:
    """A RawIo for one process serving `num_streams` streams of this job."""
    return RawIo(max_in_flight=job.max_in_flight, spares=spare_windows(job, num_streams),
                 min_bytes=int(job.window_bytes() * GROWTH), lone=num_streams == 1)
