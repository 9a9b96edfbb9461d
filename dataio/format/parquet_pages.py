"""Parquet page headers, read just far enough to check a page's CRC-32 before pyarrow decodes it.

A column chunk is a run of pages, each a Thrift compact-protocol PageHeader followed by
compressed_page_size bytes of data. Parquet's optional per-page `crc` (field 4) is the standard
CRC-32 (zlib's) of those data bytes, as stored (compressed, levels included); writers put it on
every page or on none (pyarrow: `write_page_checksum=True`). The header itself is not under it.
Only the fields a check needs are kept; every other field is skipped by its wire type, so
statistics, encodings and future fields never matter here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
MAX_HEADER_BYTES = 16 << 20  # a header this long is not one: refuse instead of buffering forever

# Thrift compact protocol wire types
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class Incomplete(Exception):
    """The bytes end inside the header: call again with more."""


@dataclass(frozen=True, slots=True)
class PageHeader:
    """What a check needs of one page header; the page's data is bytes [header_bytes, header_bytes +
    compressed_size) from the header's start."""

    page_type: int
    compressed_size: int
    crc: int | None  # unsigned CRC-32 of the data bytes; None: the writer wrote none
    num_values: int  # values (with nulls) in a data page; rows for a column that repeats nothing
    header_bytes: int

    @property
    def is_data(self) -> bool:
        return self.page_type in (DATA_PAGE, DATA_PAGE_V2)


class _Wire:
    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise Incomplete
        self.pos += 1
        return self.buf[self.pos - 1]

    def varint(self) -> int:
        out, shift = 0, 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out
            shift += 7
            if shift > 70:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n > MAX_HEADER_BYTES:
            raise ValueError("a field longer than any page header")
        if self.pos + n > len(self.buf):
            raise Incomplete
        self.pos += n

    def fields(self) -> Iterator[tuple[int, int]]:
        """The fields of the struct starting here, up to its stop byte."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def skip(self, kind: int) -> None:
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.skip_bytes(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.skip_bytes(8)
        elif kind == _BINARY:
            self.skip_bytes(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.skip_bytes(1) if elem in (_TRUE, _FALSE) else self.skip(elem)
        elif kind == _MAP:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4)
                    self.skip(kv & 0x0F)
        elif kind == _STRUCT:
            for _, k in self.fields():
                self.skip(k)
        else:
            raise ValueError(f"unknown Thrift wire type {kind}")


def parse_page_header(buf: bytes | memoryview, pos: int = 0) -> PageHeader:
    """The page header starting at buf[pos]; Incomplete when buf ends inside it, ValueError when
    the bytes are not a page header."""
    w = _Wire(buf, pos)
    page_type = compressed = num_values = None
    crc: int | None = None
    for fid, kind in w.fields():
        if fid in (1, 3, 4) and kind == _I32:
            value = w.zigzag()
            if fid == 1:
                page_type = value
            elif fid == 3:
                compressed = value
            else:
                crc = value & 0xFFFFFFFF
        elif fid in (5, 7, 8) and kind == _STRUCT:  # data / dictionary / data v2 page header
            for sub, sub_kind in w.fields():
                if sub == 1 and sub_kind == _I32:
                    num_values = w.zigzag()
                else:
                    w.skip(sub_kind)
        else:
            w.skip(kind)
        if w.pos - pos > MAX_HEADER_BYTES:
            raise ValueError("page header too long")
    if page_type is None or compressed is None or compressed < 0:
        raise ValueError("not a Parquet page header")
    return PageHeader(page_type, compressed, crc, num_values or 0, w.pos - pos)
