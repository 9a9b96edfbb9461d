"""What checks one Parquet row group read in slices (verify_checksums): its projected column chunks
with their checksums from the manifest, a PageCheck per stream, whole-chunk checks for files
without page CRCs, the errors naming what failed, and dropping the disk-cache blocks that held it.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import xxhash

from dataio.errors import ShardFormatError, VerifyCostWarning
from dataio.format.checksums import FIX, HEX_DIGITS, chunk_span
from dataio.readers.page_check import BadPage, Chunk, PageCheck
from dataio.readers.parquet_slices import block_spans


class PageMismatch(ShardFormatError):
    """Bytes of a row group read in slices do not match their checksum (a page CRC or a chunk's xxh3)."""


class SliceChecks:
    """The checks of row group `group` of shard `shard` as `reader` (a ParquetReader) reads it in slices."""

    def __init__(self, reader: Any, shard: int, md: Any, group: int) -> None:
        self.reader, self.shard, self.group = reader, shard, group
        m = reader.manifest
        self.url = reader.store.url_of(m.shard_paths[shard])
        starts = list(itertools.accumulate(m.row_groups[shard], initial=0))
        self.first_row, self.stop_row = starts[group], starts[group + 1]
        expected = m.row_group_checksums[shard]
        self.chunks: list[Chunk] = []
        if not expected:
            return  # a shard appended to a dataset written before checksums: read unchecked
        rg, want, columns = md.row_group(group), expected[group], reader.projected_columns(md)
        if len(want) != HEX_DIGITS * rg.num_columns:
            raise ShardFormatError(
                f"{self.url}: row group {group} has {rg.num_columns} columns, the manifest's checksums "
                f"{len(want) // HEX_DIGITS}: the shard was replaced; {FIX}")
        for i in range(rg.num_columns):
            cc = rg.column(i)
            if columns is None or cc.path_in_schema.split(".")[0] in columns:
                self.chunks.append(Chunk(*chunk_span(cc), want[i * HEX_DIGITS : (i + 1) * HEX_DIGITS],
                                         cc.path_in_schema, flat=md.schema.column(i).max_repetition_level == 0))

    def new(self) -> PageCheck | None:
        """The check of a new stream over the group (None: nothing to check)."""
        return PageCheck(self.chunks, fail=self._fail, prove=self._prove) if self.chunks else None

    def _prove(self, chunk: Chunk) -> bool:
        """Whether the chunk, read whole (block by block, through the disk cache), matches its checksum."""
        self._note_double_read()
        read, hasher = self.reader.block_reader(self.shard), xxhash.xxh3_64()
        for a, b in block_spans(chunk.begin, chunk.end, self.reader.manifest.shard_num_bytes[self.shard]):
            block = memoryview(read(a, b))
            hasher.update(block[max(0, chunk.begin - a) : min(b, chunk.end) - a])
        return hasher.hexdigest() == chunk.expected

    def _note_double_read(self) -> None:
        reader = self.reader
        if reader.noted_double_read:
            return
        reader.noted_double_read = True  # once per dataset and process
        warnings.warn(VerifyCostWarning(
            f"{reader.store.url}: its Parquet pages carry no CRC-32 (written without page checksums, as "
            "Hugging Face exports are), so with verify_checksums=True each column chunk of a row group read in "
            "slices (bigger than shuffle_window_bytes) is read twice: whole, to check it before any row of it "
            "is delivered, then again to decode (from the disk cache when it holds the chunk). A "
            "shuffle_window_bytes above the row groups' size reads them whole (one read, checked); `shardify "
            "write` rewrites the dataset with page checksums; verify_checksums=False skips every check "
            "(`shardify verify` checks the dataset once)"), stacklevel=2)

    def _fail(self, bad: BadPage) -> None:
        where = (f"{self.url}: row group {self.group} (rows {self.first_row}-{self.stop_row - 1}, read in slices), "
                 f"column {bad.column!r}")
        if bad.page is not None:
            rows = "" if bad.rows is None else \
                f" (rows {self.first_row + bad.rows[0]}-{self.first_row + bad.rows[1] - 1})"
            what = (f", page {bad.page}{rows}, does not match its CRC-32: the shard's bytes changed after it "
                    "was written; no row of that page was delivered")
        elif bad.whole:
            what = (", does not match its checksum (checked whole before any row of it was delivered: the file "
                    "has no page checksums): the shard's bytes changed after it was written")
        else:
            what = (", does not match its checksum though each of its pages matched its CRC-32: a page header "
                    "changed (headers are outside the CRCs), so rows of it delivered before now may be wrong")
        raise PageMismatch(f"{where}{what}; {FIX}")

    def drop_cached(self) -> bool:
        """Drop the disk-cache blocks holding the group's checked chunks; whether any was there."""
        reader, m = self.reader, self.reader.manifest
        if reader.cache is None:
            return False
        rel, checksum, size = m.shard_paths[self.shard], m.shard_checksums[self.shard], m.shard_num_bytes[self.shard]
        blocks = {span for c in self.chunks for span in block_spans(c.begin, c.end, size)}
        dropped = [reader.cache.discard(namespace=reader.store.url, path=rel, start=a, end=b, checksum=checksum)
                   for a, b in sorted(blocks)]
        return any(dropped)
