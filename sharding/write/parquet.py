"""Write one Parquet shard: one row per sample, row groups small enough to stream.

Columns: `__key__` (string), one binary column per image extension (`jpg`, `png`, ...),
`cls` (int64) when the dataset has labels, then the source's other fields. A row group closes
at `rows_per_group` rows or `bytes_per_group` bytes, whichever comes first; the sample count of
each group goes into the manifest so readers can seek to any group. Every page carries Parquet's
CRC-32 of its data, and pages stay near PAGE_BYTES (pyarrow closes a page only between write
batches, so batches are a few rows): a loader reading a big row group in slices checks each page
before decoding it (dataio/readers/page_check.py), stock readers may check them too (pyarrow:
`page_checksum_verification=True`).
"""

from __future__ import annotations

import io
import json
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from dataio.format.manifest import Checksummer, Field

ROWS_PER_GROUP = 1000
BYTES_PER_GROUP = 64 * 1024 * 1024
PAGE_BYTES = 1024 * 1024
# Rows per write batch: with pyarrow's default (1024) a page of images holds a whole row group.
WRITE_BATCH_ROWS = 8

_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "json": pa.string(), "bytes": pa.binary()}


class _ChecksumFile(io.RawIOBase):
    """A write-only file that checksums and counts every byte on its way to `inner`."""

    def __init__(self, inner: BinaryIO, checksum: Checksummer) -> None:
        self._inner, self._checksum = inner, checksum

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._inner.write(view)
        self._checksum.update(view)
        return len(view)

    def tell(self) -> int:
        return self._checksum.num_bytes


def parquet_schema(image_exts: tuple[str, ...], has_labels: bool, extra_fields: tuple[Field, ...]) -> pa.Schema:
    """The schema every shard of one dataset shares."""
    columns = [pa.field("__key__", pa.string(), nullable=False)]
    columns += [pa.field(ext, pa.binary()) for ext in image_exts]
    if has_labels:
        columns.append(pa.field("cls", pa.int64()))
    columns += [pa.field(f.name, _ARROW[f.type]) for f in extra_fields]
    return pa.schema(columns)


class ParquetShardWriter:
    """Buffers rows and flushes them as row groups into `fileobj`; `close()` returns row-group sizes."""

    def __init__(self, fileobj: BinaryIO, schema: pa.Schema, *, rows_per_group: int = ROWS_PER_GROUP,
                 bytes_per_group: int = BYTES_PER_GROUP, page_bytes: int = PAGE_BYTES) -> None:
        self.checksum = Checksummer()
        self._schema = schema
        self._json_columns = {f.name for f in schema if f.type == pa.string() and f.name != "__key__"}
        # Image bytes are already compressed and unique: compressing, dictionary-encoding or keeping
        # min/max statistics of them would only cost time (and put blobs in the footer).
        small = [f.name for f in schema if f.type != pa.binary() and f.name != "__key__"]
        self._writer = pq.ParquetWriter(_ChecksumFile(fileobj, self.checksum), schema, compression="none",
                                        use_dictionary=small, write_statistics=small, write_page_checksum=True,
                                        data_page_size=page_bytes, write_batch_size=WRITE_BATCH_ROWS)
        self._rows: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._buffered_bytes = 0
        self._rows_per_group, self._bytes_per_group = rows_per_group, bytes_per_group
        self.row_groups: list[int] = []

    @property
    def num_samples(self) -> int:
        return sum(self.row_groups) + len(self._rows["__key__"])

    @property
    def num_bytes(self) -> int:
        return self.checksum.num_bytes

    def add(self, row: dict[str, Any]) -> None:
        """Append one sample; missing columns are null, dict/list values of string columns become JSON."""
        for name, values in self._rows.items():
            value = row.get(name)
            if isinstance(value, (dict, list)) and name in self._json_columns:
                value = json.dumps(value)
            values.append(value)
            if isinstance(value, (bytes, str)):
                self._buffered_bytes += len(value)
        if len(self._rows["__key__"]) >= self._rows_per_group or self._buffered_bytes >= self._bytes_per_group:
            self._flush()

    def _flush(self) -> None:
        n = len(self._rows["__key__"])
        if not n:
            return
        self._writer.write_table(pa.table(self._rows, schema=self._schema), row_group_size=n)
        self.row_groups.append(n)
        self._rows = {name: [] for name in self._schema.names}
        self._buffered_bytes = 0

    def close(self) -> tuple[int, ...]:
        self._flush()
        self._writer.close()
        return tuple(self.row_groups)
