"""Parquet segments: only the row groups overlapping [start, stop), only the projected columns.

The footer is read once per shard (one tail request) and kept in a per-reader LRU; a segment
is then the byte ranges of its column chunks (neighbours closer than MERGE_GAP_BYTES merged
into one request), fetched through Store.read (retries, short-read checks) or the disk cache.
pyarrow decodes from those ranges through a sparse in-memory file: no temporary files, and
pyarrow never issues a request of its own. With verify_checksums, every column chunk fetched is
checked against its checksum in the manifest (format/checksums.py; a cache entry that fails is
dropped and read again from the store once); row groups read in slices are checked page by page
as they stream (page_check, parquet_checks), and a slice whose check fails with blocks from the
disk cache drops them and is read once more from the store.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dataio import forksafe
from dataio.errors import ShardFormatError
from dataio.format.checksums import FIX, bad_chunk
from dataio.format.manifest import Manifest
from dataio.readers.base import (
    METADATA_CACHE_BYTES,
    LruCache,
    Sample,
    SegmentLike,
    SizedRawFile,
    cached_read,
    check_fields,
    check_segment,
    check_shard_size,
    proportional_bytes,
    shard_offsets,
)
from dataio.readers.parquet_checks import PageMismatch, SliceChecks
from dataio.readers.parquet_slices import RangeFile, SliceStreams
from dataio.storage.store import Store

if TYPE_CHECKING:
    from dataio.storage.cache import DiskCache

FOOTER_CACHE_SHARDS = 64


def footer_bytes(metadata: Any) -> int:
    """About the memory a parsed footer holds (a few times its serialized size), for the cache's
    byte bound: a footer of thousands of row groups and columns is megabytes."""
    return 4 * int(metadata.serialized_size)
TAIL_BYTES = 64 * 1024
# pyarrow coalesces reads across holes of up to 8 KiB; merging wider gaps keeps its reads inside ours.
MERGE_GAP_BYTES = 64 * 1024


class SparseFile(SizedRawFile):
    """A read-only file of `size` bytes of which only `chunks` [(offset, bytes)] are known."""

    def __init__(self, size: int, chunks: Sequence[tuple[int, bytes]], *, url: str = "") -> None:
        super().__init__()
        self._size, self._chunks, self._url, self._pos = size, sorted(chunks), url, 0

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        for offset, data in self._chunks:
            if offset <= self._pos and self._pos + n <= offset + len(data):
                a = self._pos - offset
                memoryview(buffer)[:n] = data[a : a + n]
                self._pos += n
                return n
        # An internal invariant (our ranges cover every chunk pyarrow reads), reported plainly.
        raise OSError(f"{self._url}: bytes {self._pos}-{self._pos + n} were not fetched (a shardify bug)")


@dataclass(frozen=True, slots=True)
class ParquetPayload:
    """The fetched column-chunk ranges of some row groups; row `first_row` is the first group's first."""

    groups: tuple[int, ...]
    first_row: int
    chunks: tuple[tuple[int, bytes], ...]
    metadata: Any

    def __len__(self) -> int:
        return sum(len(d) for _, d in self.chunks)


@dataclass(frozen=True, slots=True)
class ParquetSlice:
    """Rows [start, stop) of a segment whose row groups exceed the reader's slice_bytes, already decoded."""

    table: pa.Table

    def __len__(self) -> int:
        return int(self.table.nbytes)


class ParquetReader:
    """SegmentReader for Parquet shards (one row per sample, row-group sizes in the manifest)."""

    def __init__(
        self,
        store: Store,
        manifest: Manifest,
        *,
        fields: Sequence[str] | None = None,
        cache: DiskCache | None = None,
        slice_bytes: int | None = None,
        verify_checksums: bool = False,
    ) -> None:
        """slice_bytes: segments whose row groups hold more (projected bytes) are read in slices;
        verify_checksums: check the column chunks read against the manifest's (version 3) checksums."""
        if manifest.format != "parquet":
            raise ValueError(f"ParquetReader needs a parquet manifest, got format {manifest.format!r}")
        self.store = store
        self.manifest = manifest
        self.fields = check_fields(manifest, fields)
        self.cache = cache
        self._offsets = shard_offsets(manifest)
        self._footers = LruCache(FOOTER_CACHE_SHARDS, max_bytes=METADATA_CACHE_BYTES, size_of=footer_bytes)
        self.slice_bytes = slice_bytes
        self._slices = SliceStreams()
        self.verify_checksums = verify_checksums and manifest.has_read_checksums
        self.noted_double_read = False  # the VerifyCostWarning of a file without page CRCs, given

    def metadata(self, shard: int) -> Any:
        """The shard's Parquet footer, read once (one tail request) and checked against the manifest."""
        return self._footers.get_or_load(shard, lambda: self._load_metadata(shard))

    def _load_metadata(self, shard: int) -> Any:
        m, rel = self.manifest, self.manifest.shard_paths[shard]
        url, size = self.store.url_of(rel), m.shard_num_bytes[shard]
        check_shard_size(self.store, m, shard)
        tail = self.store.read(rel, max(0, size - TAIL_BYTES), size)
        if size < 12 or tail[-4:] != b"PAR1":
            raise ShardFormatError(f"{url}: not a Parquet file (no PAR1 footer); rewrite the dataset")
        need = int.from_bytes(tail[-8:-4], "little") + 8
        if need > len(tail):
            if need > size:
                raise ShardFormatError(f"{url}: Parquet footer length {need} exceeds the file; rewrite the dataset")
            tail = self.store.read(rel, size - need, size)
        try:
            with forksafe.busy():
                md = pq.ParquetFile(SparseFile(size, [(size - len(tail), tail)], url=url)).metadata
        except (pa.ArrowException, OSError) as exc:
            raise ShardFormatError(f"{url}: unreadable Parquet footer ({exc}); rewrite the dataset") from None
        groups = tuple(md.row_group(g).num_rows for g in range(md.num_row_groups))
        if groups != m.row_groups[shard]:
            raise ShardFormatError(
                f"{url}: row groups {list(groups)[:8]} do not match the manifest's "
                f"{list(m.row_groups[shard])[:8]}; the shard was replaced: rewrite the dataset"
            )
        return md

    def _groups(self, seg: SegmentLike) -> tuple[tuple[int, ...], int]:
        """Row groups overlapping [start, stop) and the first one's starting row."""
        starts = list(itertools.accumulate(self.manifest.row_groups[seg.shard], initial=0))
        groups = tuple(g for g in range(len(starts) - 1) if starts[g] < seg.stop and starts[g + 1] > seg.start)
        return groups, (starts[groups[0]] if groups else 0)

    def projected_columns(self, md: Any) -> list[str] | None:
        """The top-level columns read (None: all)."""
        if self.fields is None:
            return None
        names = set(md.schema.to_arrow_schema().names)
        return [c for c in ("__key__", *self.fields) if c in names]

    def _ranges(self, md: Any, groups: Sequence[int]) -> list[tuple[int, int]]:
        """Merged byte ranges of the projected column chunks of `groups`."""
        columns = self.projected_columns(md)
        spans = []
        for g in groups:
            rg = md.row_group(g)
            for i in range(rg.num_columns):
                cc = rg.column(i)
                if columns is not None and cc.path_in_schema.split(".")[0] not in columns:
                    continue
                begin = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
                spans.append((begin, begin + cc.total_compressed_size))
        merged: list[list[int]] = []
        for begin, end in sorted(spans):
            if merged and begin - merged[-1][1] <= MERGE_GAP_BYTES:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([begin, end])
        return [(a, b) for a, b in merged]

    def payload_bytes(self, seg: SegmentLike) -> int:
        """Exact bytes of the ranges when the footer is loaded, else the shard's size scaled to the groups."""
        check_segment(self.manifest, seg)
        if seg.stop <= seg.start:
            return 0
        groups, _ = self._groups(seg)
        md = self._footers.get(seg.shard)
        if md is None:
            rows = sum(self.manifest.row_groups[seg.shard][g] for g in groups)
            whole = proportional_bytes(self.manifest, seg.shard, rows)
        else:
            whole = sum(b - a for a, b in self._ranges(md, groups))
        if self.slice_bytes is not None and whole > self.slice_bytes:
            return proportional_bytes(self.manifest, seg.shard, seg.stop - seg.start)
        return whole

    def _fetch_slice(self, seg: SegmentLike, md: Any, groups: tuple[int, ...]) -> ParquetSlice:
        """Only rows [start, stop), streamed from their row groups (see parquet_slices)."""
        rel = self.manifest.shard_paths[seg.shard]
        starts = list(itertools.accumulate(self.manifest.row_groups[seg.shard], initial=0))
        tables = []
        for g in groups:
            a, b = max(seg.start, starts[g]) - starts[g], min(seg.stop, starts[g + 1]) - starts[g]
            tables.append(self._read_slice(seg.shard, md, g, a, b))
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if table.num_rows != seg.stop - seg.start:
            raise ShardFormatError(f"{self.store.url_of(rel)}: row groups {list(groups)} hold fewer rows than the "
                                   "manifest says; rewrite the dataset")
        return ParquetSlice(table)

    def _read_slice(self, shard: int, md: Any, group: int, start: int, stop: int) -> pa.Table:
        """Rows [start, stop) of row group `group`; checked bytes that fail are dropped from the disk
        cache and the slice is read once more from the store (a new stream) before failing."""
        rel, columns = self.manifest.shard_paths[shard], self.projected_columns(md)
        checks = SliceChecks(self, shard, md, group) if self.verify_checksums else None
        for attempt in (0, 1):
            try:
                return self._slices.read(lambda: RangeFile(self.manifest.shard_num_bytes[shard],
                                                           self.block_reader(shard), checks and checks.new()),
                                         md, shard=shard, group=group, start=start, stop=stop, columns=columns)
            except PageMismatch:
                assert checks is not None
                if attempt or not checks.drop_cached():
                    raise
            except (pa.ArrowException, OSError) as exc:
                raise ShardFormatError(f"{self.store.url_of(rel)}: cannot decode row group {group} ({exc}); "
                                       "rewrite the dataset") from None
        raise AssertionError("unreachable")

    def block_reader(self, shard: int) -> Callable[[int, int], bytes]:
        """Bytes [a, b) of the shard through the disk cache (an aligned block is an entry)."""
        rel, checksum = self.manifest.shard_paths[shard], self.manifest.shard_checksums[shard]
        return lambda a, b: cached_read(self.store, self.cache, rel, a, b, checksum=checksum)

    def fetch(self, seg: SegmentLike) -> ParquetPayload | ParquetSlice:
        """The column-chunk bytes of the row groups overlapping the segment (few ranged reads)."""
        check_segment(self.manifest, seg)
        if seg.stop <= seg.start:
            return ParquetPayload((), 0, (), None)
        md = self.metadata(seg.shard)
        groups, first_row = self._groups(seg)
        if self.slice_bytes is not None and sum(b - a for a, b in self._ranges(md, groups)) > self.slice_bytes:
            return self._fetch_slice(seg, md, groups)
        rel, checksum = self.manifest.shard_paths[seg.shard], self.manifest.shard_checksums[seg.shard]
        ranges = self._ranges(md, groups)
        chunks = tuple((a, cached_read(self.store, self.cache, rel, a, b, checksum=checksum)) for a, b in ranges)
        if self.verify_checksums:
            chunks = self.verified(seg, md, groups, chunks)
        return ParquetPayload(groups, first_row, chunks, md)

    def verified(self, seg: SegmentLike, md: Any, groups: tuple[int, ...], chunks: tuple[tuple[int, Any], ...]) -> Any:
        """`chunks` if every projected column chunk of `groups` in them matches its checksum; cached copies
        that do not are dropped and read again from the store once; ShardFormatError naming the shard,
        the row group and its keys otherwise."""
        expected = self.manifest.row_group_checksums[seg.shard]
        if not expected:
            return chunks  # a shard appended to a dataset written before checksums
        columns = self.projected_columns(md)
        bad = bad_chunk(md, groups, chunks, expected, columns)
        rel, checksum = self.manifest.shard_paths[seg.shard], self.manifest.shard_checksums[seg.shard]
        if bad is not None and self.cache is not None:
            dropped = [self.cache.discard(namespace=self.store.url, path=rel, start=a, end=a + len(d),
                                          checksum=checksum) for a, d in chunks]
            if any(dropped):
                chunks = tuple((a, cached_read(self.store, self.cache, rel, a, a + len(d), checksum=checksum))
                               for a, d in chunks)
                bad = bad_chunk(md, groups, chunks, expected, columns)
        if bad is None:
            return chunks
        group, column = bad
        starts = list(itertools.accumulate(self.manifest.row_groups[seg.shard], initial=0))
        url, keys = self.store.url_of(rel), self._keys_of(seg, md, group, chunks)
        raise ShardFormatError(
            f"{url}: row group {group} (rows {starts[group]}-{starts[group + 1] - 1}{keys}), "
            f"column {column!r}, does not match its checksum: the shard's bytes changed after it was written "
            f"(same size, so only the checksum shows it); {FIX}"
        )

    def _keys_of(self, seg: SegmentLike, md: Any, group: int, chunks: Any) -> str:
        """', keys K1..K2' of a row group when its (fetched, intact) key column decodes, else ''."""
        try:
            source = SparseFile(self.manifest.shard_num_bytes[seg.shard], chunks)
            with forksafe.busy():
                keys = pq.ParquetFile(source, metadata=md).read_row_group(group, columns=["__key__"]).column(0)
            return f", keys {keys[0].as_py()!r}..{keys[len(keys) - 1].as_py()!r}"
        except (pa.ArrowException, OSError, KeyError, IndexError, ValueError):
            return ""

    def parse(self, seg: SegmentLike, payload: ParquetPayload | ParquetSlice) -> list[Sample]:
        """Rows [start, stop) as dicts: __key__, __id__, __url__, then one entry per (projected) column."""
        rel = self.manifest.shard_paths[seg.shard]
        url = self.store.url_of(rel)
        if isinstance(payload, ParquetSlice):
            return rows_of(payload.table, first_id=self._offsets[seg.shard] + seg.start, url=url)
        if not payload.groups:
            return []
        source = SparseFile(self.manifest.shard_num_bytes[seg.shard], payload.chunks, url=url)
        try:
            with forksafe.busy():
                pf = pq.ParquetFile(source, metadata=payload.metadata)
                table = pf.read_row_groups(list(payload.groups), columns=self.projected_columns(payload.metadata),
                                           use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise ShardFormatError(f"{url}: cannot decode row groups {list(payload.groups)} ({exc}); rewrite the dataset") from None
        table = table.slice(seg.start - payload.first_row, seg.stop - seg.start)
        return rows_of(table, first_id=int(self._offsets[seg.shard]) + seg.start, url=url)


def rows_of(table: pa.Table, *, first_id: int, url: str) -> list[Sample]:
    """Table rows as sample dicts from the shard at `url`; each column converted once, None (null) cells left out."""
    n = table.num_rows
    columns = {name: column_values(table.column(name)) for name in table.column_names if name != "__key__"}
    if "__key__" in table.column_names:
        keys = column_values(table.column("__key__"))
    else:  # plain Parquet without keys: the global sample id stands in
        keys = [f"{first_id + i:012d}" for i in range(n)]
    out: list[Sample] = []
    for i in range(n):
        d: Sample = {"__key__": keys[i], "__id__": first_id + i, "__url__": url}
        for name, values in columns.items():
            value = values[i]
            if value is not None:
                d[name] = value
        out.append(d)
    return out


def column_values(column: pa.ChunkedArray) -> list[Any]:
    """Python values of a column: bytes for binary, str for strings, int/float/bool for numbers;
    a Hugging Face image struct {bytes, path} gives its bytes (None where a row has none)."""
    t = column.type
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
        child = pa.chunked_array([chunk.field("bytes") for chunk in column.chunks], t.field("bytes").type)
        if column.null_count:  # a null struct hides whatever its child holds
            child = pa.chunked_array([pc.if_else(chunk.is_valid(), chunk.field("bytes"), None)
                                      for chunk in column.chunks], t.field("bytes").type)
        return column_values(child)
    if column.null_count == 0:
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            return column.to_numpy().tolist()
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            values = [v for chunk in column.chunks for v in _binary_values(chunk)]
            return [v.decode() for v in values] if pa.types.is_string(t) or pa.types.is_large_string(t) else values
    return column.to_pylist()


def _binary_values(chunk: pa.Array) -> list[bytes]:
    """Slice a null-free binary/string array's data buffer by its offsets: one copy per value."""
    if len(chunk) == 0:
        return []
    large = pa.types.is_large_binary(chunk.type) or pa.types.is_large_string(chunk.type)
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[chunk.offset : chunk.offset + len(chunk) + 1].tolist()
    data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
    return [data[a:b].tobytes() for a, b in zip(offsets, offsets[1:])]
