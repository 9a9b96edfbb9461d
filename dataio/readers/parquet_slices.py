"""Row groups too big for the loader's memory budget, read in slices (Hugging Face exports often
hold a few hundred MB per row group).

A slice streams the group page by page through pyarrow's buffered reader over a lazily fetched
file (RangeFile: aligned blocks of BLOCK_BYTES through a reader-given function, the disk cache and
Store.read, so retries and short-read checks apply and a block is a cache entry), keeping only
rows [start, stop). The next slice of the same group usually starts where this one stopped (a
worker reads its shards front to back), so the open stream is kept and continued instead of
re-reading the group from its start. Memory per slice: its own rows, one page and MAX_BLOCKS
blocks. Which rows a slice holds never depends on this: the plan's guarantees are the plan's.
With checksums, every byte the stream reads passes through a PageCheck (page_check.py) before
pyarrow sees it: each page is checked against its CRC-32 before any row of it is decoded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dataio import forksafe
from dataio.readers.base import SizedRawFile
from dataio.readers.page_check import PageCheck

BLOCK_BYTES = 8 << 20
MAX_BLOCKS = 2  # per open stream: two columns read side by side keep a block each
PAGE_BUFFER_BYTES = 1 << 20
BATCH_ROWS = 16
MAX_OPEN_STREAMS = 4  # per reader: each holds a page and its blocks


def block_spans(begin: int, end: int, size: int) -> list[tuple[int, int]]:
    """The aligned blocks [a, b) of a file of `size` bytes that hold bytes [begin, end)."""
    first, last = begin // BLOCK_BYTES, (max(begin, end - 1)) // BLOCK_BYTES
    return [(k * BLOCK_BYTES, min(size, (k + 1) * BLOCK_BYTES)) for k in range(first, last + 1)]


class RangeFile(SizedRawFile):
    """A read-only file of `size` bytes fetched as aligned blocks, `read_block(a, b)` giving bytes [a, b)."""

    def __init__(self, size: int, read_block: Callable[[int, int], bytes], check: PageCheck | None = None) -> None:
        super().__init__()
        self._size, self._read_block, self._check = size, read_block, check
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()  # block number -> its bytes, least recent first

    def _block(self, k: int) -> bytes:
        data = self._blocks.pop(k, None)
        if data is None:
            data = self._read_block(k * BLOCK_BYTES, min(self._size, (k + 1) * BLOCK_BYTES))
        self._blocks[k] = data
        while len(self._blocks) > MAX_BLOCKS:
            self._blocks.popitem(last=False)
        return data

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        out, done = memoryview(buffer).cast("B"), 0
        while done < n:
            pos = self._pos + done
            k = pos // BLOCK_BYTES
            block = memoryview(self._block(k))
            a = pos - k * BLOCK_BYTES
            m = min(n - done, len(block) - a)
            if self._check is not None:  # before pyarrow can see the bytes
                self._check.feed(pos, block[a : a + m])
            out[done : done + m] = block[a : a + m]
            done += m
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
        self, open_file: Callable[[], RangeFile], metadata: Any, *, shard: int, group: int, start: int, stop: int,
        columns: list[str] | None,
    ) -> pa.Table:
        """Rows [start, stop) of row group `group` (row numbers within the group) as a table;
        `open_file` gives the file a new stream reads (with its checks). A stream that raised is dropped."""
        with self._lock:
            stream = self._open.pop((shard, group), None)
        if stream is None or stream.next_row > start:
            with forksafe.busy():
                pf = pq.ParquetFile(open_file(), metadata=metadata, buffer_size=PAGE_BUFFER_BYTES, pre_buffer=False)
                stream = _Stream(pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns,
                                                 use_threads=False), 0)
        pieces = []
        row = stream.next_row
        while row < stop:
            with forksafe.busy():
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
