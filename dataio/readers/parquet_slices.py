"""Row groups too big for the loader's memory budget, read in slices (Hugging Face exports often
hold a few hundred MB per row group).

A slice streams the group page by page through pyarrow's buffered reader over a lazily fetched
file (RangeFile: ranged reads of READ_AHEAD_BYTES through Store.read, so retries and short-read
checks apply), keeping only rows [start, stop). The next slice of the same group usually starts
where this one stopped (a worker reads its shards front to back), so the open stream is kept and
continued instead of re-reading the group from its start. Memory per slice: its own rows, one
page and one read-ahead buffer. Which rows a slice holds never depends on this: the plan's
guarantees are the plan's. With checksums (`ChunkCheck`), each column chunk is hashed as the
stream reads it, front to back, and checked when its last byte is read: a changed chunk fails
then, so rows of it that earlier slices delivered were not checked; a slice that stops before
the group's end checks nothing of that group.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from dataio.readers.base import SizedRawFile
from dataio.storage.store import Store

READ_AHEAD_BYTES = 8 << 20
PAGE_BUFFER_BYTES = 1 << 20
BATCH_ROWS = 16
MAX_OPEN_STREAMS = 4  # per reader: each holds a page and a read-ahead buffer


class ChunkCheck:
    """Hashes column chunks [(begin, end, expected xxh3-64 hex, name)] as their bytes are read front to
    back (`feed`), and calls `mismatch(name)` (which raises) when a finished chunk differs; a chunk
    read out of order (a gap) is left unchecked."""

    def __init__(self, chunks: Sequence[tuple[int, int, str, str]], mismatch: Callable[[str], None]) -> None:
        self.chunks, self.mismatch = sorted(chunks), mismatch
        self._state: list[tuple[Any, int] | None] = [(xxhash.xxh3_64(), a) for a, _, _, _ in self.chunks]

    def feed(self, pos: int, data: memoryview) -> None:
        end = pos + len(data)
        for k, (a, b, want, name) in enumerate(self.chunks):
            state = self._state[k]
            if state is None or b <= pos or a >= end:
                continue
            hasher, next_pos = state
            lo, hi = max(pos, next_pos), min(end, b)
            if lo > next_pos:  # bytes skipped: this chunk cannot be checked from this stream
                self._state[k] = None
                continue
            if hi > lo:
                hasher.update(data[lo - pos : hi - pos])
                next_pos = hi
            self._state[k] = (hasher, next_pos)
            if next_pos == b:
                self._state[k] = None
                if hasher.hexdigest() != want:
                    self.mismatch(name)


class RangeFile(SizedRawFile):
    """A read-only file of `size` bytes fetched in ranged reads of at least READ_AHEAD_BYTES."""

    def __init__(self, store: Store, rel: str, size: int, check: ChunkCheck | None = None) -> None:
        super().__init__()
        self._store, self._rel, self._size, self._check = store, rel, size, check
        self._pos, self._buf_start, self._buf = 0, 0, b""

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        if n == 0:
            return 0
        if not (self._buf_start <= self._pos and self._pos + n <= self._buf_start + len(self._buf)):
            end = min(self._size, self._pos + max(n, READ_AHEAD_BYTES))
            self._buf, self._buf_start = self._store.read(self._rel, self._pos, end), self._pos
        a = self._pos - self._buf_start
        memoryview(buffer)[:n] = self._buf[a : a + n]
        if self._check is not None:
            self._check.feed(self._pos, memoryview(self._buf)[a : a + n])
        self._pos += n
        return n


@dataclass
class _Stream:
    """An open pass over one row group: the next row it yields (row number within the group)."""

    batches: Iterator[pa.RecordBatch]
    next_row: int
    pending: pa.RecordBatch | None = None  # rows read past the last slice's stop


class SliceStreams:
    """Slices of big row groups, continuing open streams where the previous slice stopped."""

    def __init__(self) -> None:
        self._open: OrderedDict[tuple[int, int], _Stream] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # streams are per process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def read(
        self, store: Store, rel: str, size: int, metadata: Any, *, shard: int, group: int, start: int, stop: int,
        columns: list[str] | None, check: Callable[[], ChunkCheck] | None = None,
    ) -> pa.Table:
        """Rows [start, stop) of row group `group` (row numbers within the group) as a table; `check`
        makes the ChunkCheck of a new stream (None: unchecked)."""
        with self._lock:
            stream = self._open.pop((shard, group), None)
        if stream is None or stream.next_row > start:
            source = RangeFile(store, rel, size, None if check is None else check())
            pf = pq.ParquetFile(source, metadata=metadata, buffer_size=PAGE_BUFFER_BYTES, pre_buffer=False)
            stream = _Stream(pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns,
                                             use_threads=False), 0)
        pieces = []
        row = stream.next_row
        while row < stop:
            batch = stream.pending if stream.pending is not None else next(stream.batches, None)
            stream.pending = None
            if batch is None:
                break
            begin, end = row, row + batch.num_rows
            if end > start:
                pieces.append(batch.slice(max(0, start - begin), min(end, stop) - max(begin, start)))
            if end > stop:
                stream.pending = batch.slice(stop - begin)
                end = stop
            row = end
        stream.next_row = row
        with self._lock:
            self._open[(shard, group)] = stream
            while len(self._open) > MAX_OPEN_STREAMS:
                self._open.popitem(last=False)
        if not pieces:
            schema = metadata.schema.to_arrow_schema()
            return schema.empty_table() if columns is None else schema.empty_table().select(columns)
        return pa.Table.from_batches(pieces)
