"""Checksums at the granularity workers read: one per tar sample, one per Parquet column chunk.

The manifest's per-shard checksum covers a whole shard, but a worker reads samples [start, stop)
of it (one ranged read) or some column chunks of some row groups; these let it check exactly
what it read, with one xxh3-64 pass over bytes already in memory.

Tar: a sidecar beside each shard, `shards/shard-000042.sums` (the index stays DALI's v1.2 text,
which DALI's parser reads as groups of `EXT OFFSET SIZE NAME`: no room for another column):

    bytes 0-7    b"SFYSUMS1"
    bytes 8-15   the number of samples n, uint64 little-endian
    then         n uint64 little-endian: xxh3-64 of each sample's data span, the bytes from its
                 first member's data to its last member's data end (TarIndex.span(i, i + 1)),
                 which a ranged read of samples [a, b) holds whole

The manifest keeps the sidecar's checksum ("sums_checksum"); its path and size follow from the
shard's. Parquet: per row group, the xxh3-64 of each column chunk as stored (from its dictionary
page, or first data page, over total_compressed_size bytes), 16 hex digits each, concatenated in
column order: the manifest's "row_group_checksums", a list per shard beside "row_groups". A row
group read in slices is checked finer still, page by page, with Parquet's own CRC-32 in each page
header (parquet_pages.py; shardify's writer puts one on every page): no manifest field needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from dataio.errors import ShardFormatError
from dataio.format.tar_index import IndexedSample, TarIndex

SUMS_SUFFIX = ".sums"
SUMS_MAGIC = b"SFYSUMS1"
SUMS_HEADER_BYTES = 16
HEX_DIGITS = 16  # one xxh3-64 in hex
FIX = "rewrite the dataset (`shardify write ... --overwrite`), or run `shardify verify` to list every damaged shard"


def checksum_bytes(data: bytes | memoryview) -> str:
    """The manifest's checksum of a byte string (xxh3-64, 16 hex digits)."""
    return xxhash.xxh3_64_hexdigest(data)


class Checksummer:
    """Incremental twin of `checksum_bytes` for data written or read in pieces."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_64()
        self.num_bytes = 0

    def update(self, data: bytes | memoryview) -> None:
        self._h.update(data)
        self.num_bytes += len(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def sums_path(shard_path: str) -> str:
    """The sidecar of a tar shard: `shards/shard-000042.tar` -> `shards/shard-000042.sums`."""
    return shard_path.rsplit(".", 1)[0] + SUMS_SUFFIX


def sums_bytes(num_samples: int) -> int:
    """The sidecar's size for a shard of `num_samples` samples."""
    return SUMS_HEADER_BYTES + 8 * num_samples


def sample_sums(data: Any, samples: Sequence[IndexedSample], *, base: int = 0) -> list[int]:
    """xxh3-64 of each sample's data span; `data` holds the shard's bytes from offset `base` on."""
    view = memoryview(data).cast("B")
    out = []
    for s in samples:
        a = s.members[0].offset - base
        b = max(m.offset + m.size for m in s.members) - base
        out.append(xxhash.xxh3_64_intdigest(view[a:b]))
    return out


def dumps_sums(sums: Sequence[int]) -> bytes:
    """The sidecar's bytes for per-sample checksums `sums`."""
    body = np.asarray(sums, dtype="<u8").tobytes()
    return SUMS_MAGIC + len(sums).to_bytes(8, "little") + body


def parse_sums(data: bytes, *, num_samples: int, url: str) -> list[int]:
    """The per-sample checksums of a sidecar; ShardFormatError naming `url` when it is malformed."""
    if (len(data) != sums_bytes(num_samples) or data[:8] != SUMS_MAGIC
            or int.from_bytes(data[8:16], "little") != num_samples):
        raise ShardFormatError(f"{url}: not a checksum sidecar of {num_samples} samples ({len(data)} bytes); {FIX}")
    return np.frombuffer(data, dtype="<u8", offset=SUMS_HEADER_BYTES).tolist()


@dataclass(frozen=True, slots=True)
class SampleSums:
    """A tar shard's per-sample checksums and each sample's data span [starts[i], ends[i]) in the
    shard: (n,) uint64 and int64 arrays, so a check costs one hash per sample and nothing else."""

    sums: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.sums.nbytes + self.starts.nbytes + self.ends.nbytes

    @classmethod
    def of_index(cls, sums: Sequence[int], index: TarIndex) -> SampleSums:
        """For a whole shard: the spans come from the index's columns (no loop per sample)."""
        columns = index.columns
        return cls(np.asarray(sums, dtype=np.uint64), columns.starts, columns.ends)

    @classmethod
    def of(cls, sums: Sequence[int], samples: Sequence[IndexedSample]) -> SampleSums:
        starts = np.fromiter((s.members[0].offset for s in samples), dtype=np.int64, count=len(samples))
        ends = np.fromiter((max(m.offset + m.size for m in s.members) for s in samples), dtype=np.int64,
                           count=len(samples))
        return cls(np.asarray(sums, dtype=np.uint64), starts, ends)

    def first_bad(self, data: Any, base: int, first: int, stop: int) -> int | None:
        """The first sample of [first, stop) whose bytes (in `data`, from shard offset `base`) do not
        match its checksum, counted from `first`; None when all match."""
        view, digest = memoryview(data).cast("B"), xxhash.xxh3_64_intdigest
        starts, ends = (self.starts[first:stop] - base).tolist(), (self.ends[first:stop] - base).tolist()
        for i, (a, b, want) in enumerate(zip(starts, ends, self.sums[first:stop].tolist())):
            if digest(view[a:b]) != want:
                return i
        return None


def first_bad_sample(data: Any, base: int, samples: Sequence[IndexedSample], sums: Sequence[int]) -> int | None:
    """The position in `samples` of the first whose bytes (in `data`, from shard offset `base`)
    do not match its checksum in `sums` (same order); None when all match."""
    return SampleSums.of(sums, samples).first_bad(data, base, 0, len(samples))


def checksum_column(fmt: str, column: Any) -> dict[str, Any]:
    """The Manifest keyword for a version-3 shard table's checksum column (None: a legacy manifest).

    ValueError (reported by the caller as a malformed manifest) unless each entry is "" / [] or
    16-hex-digit checksums (Parquet: one string per row group, 16 hex digits per column chunk).
    """
    if column is None:
        return {}
    if fmt in ("tar", "tokens"):  # tokens: the checksum of its per-block sums sidecar
        sums = tuple(column)
        if not all(isinstance(c, str) and len(c) in (0, HEX_DIGITS) for c in sums):
            raise ValueError("sums_checksum entries must be 16 hex digits (or empty)")
        return {"sums_checksums": sums}
    groups = tuple(tuple(r) for r in column)
    if not all(isinstance(c, str) and len(c) % HEX_DIGITS == 0 for r in groups for c in r):
        raise ValueError("row_group_checksums entries must be lists of 16-hex-digit groups")
    return {"row_group_checksums": groups}


# --- Parquet ------------------------------------------------------------------------------


def chunk_span(column_chunk: Any) -> tuple[int, int]:
    """[begin, end) of one column chunk as stored (pyarrow ColumnChunkMetaData)."""
    cc = column_chunk
    begin = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
    return begin, begin + cc.total_compressed_size


def row_group_sums(metadata: Any, read: Callable[[int, int], Any]) -> tuple[str, ...]:
    """Per row group, the hex xxh3-64 of each column chunk concatenated; `read(a, b)` gives bytes [a, b)."""
    out = []
    for g in range(metadata.num_row_groups):
        rg = metadata.row_group(g)
        out.append("".join(xxhash.xxh3_64_hexdigest(read(*chunk_span(rg.column(i)))) for i in range(rg.num_columns)))
    return tuple(out)


def chunk_spans(metadata: Any) -> list[list[tuple[int, int]]]:
    """Per row group, [begin, end) of each of its column chunks, in column order."""
    return [[chunk_span(metadata.row_group(g).column(i)) for i in range(metadata.row_group(g).num_columns)]
            for g in range(metadata.num_row_groups)]


class SpanSums:
    """row_group_sums of a file fed front to back in pieces (`update(offset, data)`, offsets rising):
    one pass serves the whole-file checksum and these at once."""

    def __init__(self, metadata: Any) -> None:
        self.groups = chunk_spans(metadata)
        self._spans = sorted((a, b, g, i) for g, spans in enumerate(self.groups) for i, (a, b) in enumerate(spans))
        self._hashers = {(g, i): xxhash.xxh3_64() for _, _, g, i in self._spans}
        self._next = 0  # spans before this one are complete

    def update(self, offset: int, data: Any) -> None:
        view, end = memoryview(data).cast("B"), offset + len(data)
        k = self._next
        while k < len(self._spans) and self._spans[k][0] < end:
            a, b, g, i = self._spans[k]
            if b > offset:
                self._hashers[(g, i)].update(view[max(a, offset) - offset:min(b, end) - offset])
            if b > end:
                break
            k += 1
        self._next = k

    def hexdigests(self) -> tuple[str, ...]:
        """One string per row group, like row_group_sums."""
        return tuple("".join(self._hashers[(g, i)].hexdigest() for i in range(len(spans)))
                     for g, spans in enumerate(self.groups))


def file_row_group_sums(fileobj: Any) -> tuple[str, ...]:
    """row_group_sums of a whole Parquet file open for reading (seekable): one chunk in memory at a time."""
    import pyarrow.parquet as pq

    fileobj.seek(0)
    metadata = pq.ParquetFile(fileobj).metadata

    def read(a: int, b: int) -> bytes:
        fileobj.seek(a)
        return fileobj.read(b - a)

    return row_group_sums(metadata, read)


def bad_chunk(
    metadata: Any, groups: Sequence[int], chunks: Sequence[tuple[int, Any]], expected: Sequence[str],
    columns: Sequence[str] | None,
) -> tuple[int, str] | None:
    """(row group, column) of the first column chunk of `groups` (projected to top-level `columns`,
    None: all) whose bytes in the fetched `chunks` [(offset, bytes)] differ from `expected` (one
    entry per row group of the shard); None when all match. A chunk not fetched whole is a bug."""
    for g in groups:
        rg, want = metadata.row_group(g), expected[g]
        if len(want) != HEX_DIGITS * rg.num_columns:
            return g, f"<{rg.num_columns} columns, the manifest has {len(want) // HEX_DIGITS}>"
        for i in range(rg.num_columns):
            cc = rg.column(i)
            name = cc.path_in_schema.split(".")[0]
            if columns is not None and name not in columns:
                continue
            a, b = chunk_span(cc)
            got = _slice(chunks, a, b)
            if got is None or xxhash.xxh3_64_hexdigest(got) != want[i * HEX_DIGITS:(i + 1) * HEX_DIGITS]:
                return g, cc.path_in_schema
    return None


def _slice(chunks: Sequence[tuple[int, Any]], a: int, b: int) -> Any:
    for offset, data in chunks:
        if offset <= a and b <= offset + len(data):
            return memoryview(data).cast("B")[a - offset:b - offset]
    return None
