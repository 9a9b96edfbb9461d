"""Checks of Parquet column chunks read as a stream, front to back, before pyarrow decodes them.

A row group too big for the loader's window is read in slices (parquet_slices): rows reach the
training loop long before the stream has read a column chunk's last byte, so the chunk's xxh3
in the manifest can only be checked at its end. Each page is checked on its own instead: the
stream's bytes pass through `feed` on their way to pyarrow, which walks the page headers, and a
page whose data does not match its Parquet CRC-32 fails the moment its last byte is read,
before pyarrow has it, so no row of it is delivered. (pyarrow's own page_checksum_verification
would do the same check, but it silently passes pages without a CRC and cannot name the page.)

A chunk whose pages carry no CRC (written without them: Hugging Face exports, most Parquet in
the wild) is checked whole, with `prove`, when its first page header shows it: before any row of
it is decoded, at the cost of reading the chunk a second time. Bytes that skip ahead in a chunk
(never done by pyarrow's sequential page reader) are handled the same way. The chunk's own xxh3
is still checked when its last byte is read: it also covers the page headers, which no CRC does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

try:  # ISA-L's CRC-32 (carry-less multiplication): about 13 GB/s here, zlib's about 1
    from isal.isal_zlib import crc32
except ImportError:  # the same function, slower
    from zlib import crc32

from dataio.format.parquet_pages import (
    MAX_HEADER_BYTES,
    Incomplete,
    PageHeader,
    parse_page_header,
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One projected column chunk: bytes [begin, end) of the file, its xxh3-64 (hex) from the
    manifest, its column's path, and whether a data page's values are rows (no repetition)."""

    begin: int
    end: int
    expected: str
    name: str
    flat: bool = True


@dataclass(frozen=True, slots=True)
class BadPage:
    """Where a check failed. page None: the chunk as a whole (checked with `prove`, or its xxh3 at
    its end); rows: [first, stop) within the row group, None when unknown."""

    column: str
    page: int | None
    rows: tuple[int, int] | None
    whole: bool  # the chunk was checked whole (no page CRCs) before any row of it was decoded


@dataclass(slots=True)
class _State:
    chunk: Chunk
    hasher: Any = field(default_factory=xxhash.xxh3_64)
    pos: int = 0  # the next byte expected
    done: bool = False  # checked (or failed): nothing more to do
    carry: bytes = b""  # the start of a header split across reads
    page: PageHeader | None = None  # the page whose data is being read
    data_end: int = 0
    crc: int = 0
    ordinal: int = 0  # pages started so far
    rows_done: int = 0  # rows of the data pages finished so far


class PageCheck:
    """Checks `chunks` as their bytes are fed front to back; `fail(BadPage)` raises, `prove(chunk)`
    returns True when the chunk's bytes read whole match its checksum."""

    def __init__(self, chunks: Sequence[Chunk], *, fail: Callable[[BadPage], None],
                 prove: Callable[[Chunk], bool]) -> None:
        self._states = [_State(c) for c in sorted(chunks, key=lambda c: c.begin)]
        for s in self._states:
            s.pos = s.chunk.begin
        self._fail, self._prove = fail, prove
        self.num_proven = 0  # chunks checked whole (they had no page CRCs)

    def feed(self, pos: int, data: memoryview) -> None:
        """Bytes [pos, pos + len(data)) of the file, just read, not yet handed to pyarrow."""
        end = pos + len(data)
        for s in self._states:
            c = s.chunk
            if s.done or c.end <= pos or c.begin >= end:
                continue
            lo, hi = max(pos, s.pos), min(end, c.end)
            if lo > s.pos:  # bytes skipped: only a whole read can check this chunk
                self._whole(s)
                continue
            if hi <= lo:
                continue  # read again: already seen
            piece = data[lo - pos : hi - pos]
            s.hasher.update(piece)
            self._walk(s, lo, piece)
            s.pos = hi
            if not s.done and hi == c.end:
                s.done = True
                if s.hasher.hexdigest() != c.expected:  # only a changed page header gets here
                    self._fail(BadPage(c.name, None, None, whole=False))

    def _walk(self, s: _State, at: int, piece: memoryview) -> None:
        """Page headers and CRCs of `piece` (the chunk's bytes from `at`)."""
        i = 0
        while i < len(piece) and not s.done:
            if s.page is None:
                buf = s.carry + bytes(piece[i:]) if s.carry else piece[i:]
                try:
                    header = parse_page_header(buf)
                except Incomplete:
                    s.carry = bytes(buf)
                    if len(s.carry) > MAX_HEADER_BYTES:  # not a header after all
                        self._whole(s)
                    return
                except ValueError:
                    self._whole(s)
                    return
                used = header.header_bytes - len(s.carry)
                s.carry, i = b"", i + used
                if header.crc is None:
                    self._whole(s)
                    return
                s.page, s.crc = header, 0
                s.data_end = at + i + header.compressed_size
            n = min(len(piece) - i, s.data_end - (at + i))
            s.crc = crc32(piece[i : i + n], s.crc)
            i += n
            if at + i == s.data_end:
                self._page_done(s)

    def _page_done(self, s: _State) -> None:
        page, c = s.page, s.chunk
        assert page is not None
        rows = None
        if page.is_data and c.flat:
            rows = (s.rows_done, s.rows_done + page.num_values)
            s.rows_done += page.num_values
        if s.crc != page.crc:
            s.done = True
            self._fail(BadPage(c.name, s.ordinal, rows, whole=False))
        s.ordinal += 1
        s.page = None  # the next page's header starts at data_end

    def _whole(self, s: _State) -> None:
        s.done = True
        self.num_proven += 1
        if not self._prove(s.chunk):
            self._fail(BadPage(s.chunk.name, None, None, whole=True))
