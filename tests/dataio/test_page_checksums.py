"""Row groups read in slices are checked page by page (issue 9 part 3, issue 10): a byte changed in
one Parquet page, same size, fails before any row of that page is delivered, naming the shard, the
row group, the page's rows and the fix; a changed disk-cache block is dropped and read again; a
file without page CRCs is checked whole first, with one VerifyCostWarning; verify_checksums=False
does none of it. Before, a sliced group was checked only when the stream had read a column
chunk's last byte: rows of a changed page earlier in the chunk were delivered silently."""

from __future__ import annotations

import io
import warnings
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from dataio import ShardFormatError, VerifyCostWarning, make_loader
from dataio.format.checksums import chunk_span, file_row_group_sums
from dataio.format.manifest import (
    Field,
    Manifest,
    checksum_bytes,
    read_manifest,
    write_manifest,
)
from dataio.format.parquet_pages import Incomplete, parse_page_header
from dataio.plan.types import Segment
from dataio.readers import page_check
from dataio.readers.parquet import ParquetReader, ParquetSlice
from dataio.storage.cache import DIGEST_BYTES, DiskCache
from dataio.storage.store import Store
from sharding.write.parquet import ParquetShardWriter, parquet_schema
from tests.dataio.test_checksums import flip_byte

pytestmark = pytest.mark.timeout(120)
ROWS, VALUE_BYTES, PAGE_ROWS = 96, 40_000, 4  # one row group of 3.8 MB: beyond pyarrow's 1 MiB buffer
SLICE_BYTES = 100_000  # the loader's window: 12-row slices
PIECES = [Segment(shard=0, start=a, stop=a + 12) for a in range(0, ROWS, 12)]


def big_dataset(root: Path | Store, *, crc: bool = True) -> tuple[Store, list[bytes]]:
    """One shard, one row group of ROWS rows of random `blob`s, pages of PAGE_ROWS rows (with CRC-32s
    or none), and its manifest with row-group checksums; returns the store and the blobs."""
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(VALUE_BYTES) for _ in range(ROWS)]
    table = pa.table({"__key__": [f"{i:04d}" for i in range(ROWS)], "blob": blobs, "cls": list(range(ROWS))})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=ROWS, write_batch_size=PAGE_ROWS, data_page_size=1,
                   use_dictionary=False, compression="none", write_page_checksum=crc)
    data, store = buf.getvalue(), root if isinstance(root, Store) else Store(str(root))
    store.write_bytes("part-0.parquet", data)
    write_manifest(store, Manifest(
        format="parquet", fields=(Field(name="blob", type="bytes"), Field(name="cls", type="int")),
        shard_paths=("part-0.parquet",), shard_num_samples=(ROWS,), shard_num_bytes=(len(data),),
        shard_checksums=(checksum_bytes(data),), row_groups=((ROWS,),), source="tests",
        row_group_checksums=(file_row_group_sums(io.BytesIO(data)),)))
    return store, blobs


def pages_of(data: bytes, column: str, group: int = 0) -> list[tuple[int, int, int, int | None]]:
    """(data start, data end, num_values, crc) of each page of `column`'s chunk in `group`."""
    rg = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(group)
    a, b = chunk_span(next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == column))
    out = []
    while a < b:
        h = parse_page_header(data, a)
        out.append((a + h.header_bytes, a + h.header_bytes + h.compressed_size, h.num_values, h.crc))
        a += h.header_bytes + h.compressed_size
    assert a == b  # the walk ends exactly at the chunk's end
    return out


def flip_page_of_row(store: Store, row: int) -> tuple[int, int]:
    """Change one byte in the middle of the `blob` page holding `row`; its rows [first, stop)."""
    path = store.path("part-0.parquet")
    first = 0
    for begin, end, n, _ in pages_of(Path(path).read_bytes(), "blob"):
        if first <= row < first + n:
            flip_byte(path, (begin + end) // 2)
            return first, first + n
        first += n
    raise AssertionError(row)


def read_slices(reader: ParquetReader, delivered: list[bytes]) -> None:
    for seg in PIECES:
        payload = reader.fetch(seg)
        assert isinstance(payload, ParquetSlice)
        delivered += [s["blob"] for s in reader.parse(seg, payload)]


# --- the format -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("crc", [True, False])
def test_page_headers_walk_every_chunk_as_pyarrow_wrote_it(version, crc):
    rng = np.random.default_rng(1)
    table = pa.table({"k": [f"{i}" for i in range(50)], "b": [rng.bytes(3000) for _ in range(50)],
                      "s": [None if i % 3 else "x" * i for i in range(50)], "l": [[i] * (i % 4) for i in range(50)]})
    buf = io.BytesIO()
    pq.write_table(table, buf, data_page_version=version, write_page_checksum=crc, write_batch_size=7,
                   data_page_size=10_000, compression="zstd", use_dictionary=["k", "s"])
    data = buf.getvalue()
    for column in ("k", "b", "s", "l.list.element"):
        pages = pages_of(data, column)
        assert all((c is not None) == crc for *_, c in pages)
        assert all(c is None or zlib.crc32(data[a:b]) == c for a, b, _, c in pages)
    assert len(pages_of(data, "b")) > 5
    with pytest.raises(Incomplete):
        parse_page_header(data[4:9])
    with pytest.raises(ValueError):
        parse_page_header(b"\x00")


@pytest.mark.parametrize("split", [(1, 5, 17), (30,), ()])
def test_page_check_follows_headers_split_across_reads(tmp_path, split):
    """Bytes fed in pieces cut inside every page header (1, 5 and 17 bytes in, say) or not: an
    intact chunk passes, a changed one fails at the changed page, naming its rows."""
    store, _ = big_dataset(tmp_path / "ds")
    data = Path(store.path("part-0.parquet")).read_bytes()
    rg = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    begin, end = chunk_span(rg.column(1))
    chunk = page_check.Chunk(begin, end, xxhash.xxh3_64_hexdigest(data[begin:end]), "blob")
    headers = [begin] + [b for _, b, _, _ in pages_of(data, "blob")[:-1]]  # where each page header starts
    cuts = sorted({0, len(data), *range(0, len(data), 1 << 20), *(h + k for h in headers for k in split)})
    failures: list[page_check.BadPage] = []

    def feed(blob: bytes) -> None:
        check = page_check.PageCheck([chunk], fail=failures.append, prove=lambda c: False)
        for a, b in zip(cuts, cuts[1:]):
            check.feed(a, memoryview(blob)[a:b])
        assert check.num_proven == 0

    feed(data)
    assert failures == []
    changed = bytearray(data)
    _, b, _, _ = pages_of(data, "blob")[9]
    changed[b - 1] ^= 1
    feed(bytes(changed))
    assert failures == [page_check.BadPage("blob", 9, (36, 40), whole=False)]


def test_shardify_writes_a_crc_on_every_page_and_pages_near_a_mebibyte():
    rng = np.random.default_rng(2)
    buf = io.BytesIO()
    writer = ParquetShardWriter(buf, parquet_schema(("jpg",), True, ()), rows_per_group=200)
    for i in range(200):
        writer.add({"__key__": f"{i:04d}", "jpg": rng.bytes(100_000), "cls": i % 3})
    writer.close()
    data = buf.getvalue()
    for column in ("__key__", "jpg", "cls"):
        pages = pages_of(data, column)
        assert all(c is not None and zlib.crc32(data[a:b]) == c for a, b, _, c in pages)
    sizes = [b - a for a, b, _, _ in pages_of(data, "jpg")]
    assert len(sizes) > 10 and max(sizes) < 2 << 20  # a page of images, not the whole 20 MB chunk
    pf = pq.ParquetFile(io.BytesIO(data), page_checksum_verification=True)  # stock readers may check them
    assert pf.read().num_rows == 200


# --- a changed page -------------------------------------------------------------------------


def test_a_changed_page_fails_before_any_row_of_it_is_delivered(tmp_path):
    store, blobs = big_dataset(tmp_path / "ds")
    first, stop = flip_page_of_row(store, 30)  # rows 28-31 of 96: long before the chunk's end
    m = read_manifest(store)
    quiet: list[bytes] = []
    read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES), quiet)
    assert len(quiet) == ROWS and quiet[first:stop] != blobs[first:stop]  # unchecked: served
    delivered: list[bytes] = []
    with pytest.raises(ShardFormatError) as err:
        read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, verify_checksums=True), delivered)
    # The slices before the one reaching the page (pyarrow decodes 16-row batches), all intact
    assert delivered == blobs[: len(delivered)] and 12 <= len(delivered) <= first
    message = str(err.value)
    assert store.url_of("part-0.parquet") in message
    assert f"row group 0 (rows 0-95, read in slices), column 'blob', page {first // PAGE_ROWS} (rows {first}-{stop - 1})" in message
    assert "no row of that page was delivered" in message and "rewrite" in message and "shardify verify" in message


def test_the_loader_stops_at_the_changed_page(tmp_path):
    store, blobs = big_dataset(tmp_path / "ds")
    first, _ = flip_page_of_row(store, 62)
    for num_workers in (0, 1):
        seen: list[bytes] = []
        loader = make_loader(store.raw_url, batch_size=4, num_workers=num_workers, decode=None, shuffle=False,
                             shuffle_window_bytes=SLICE_BYTES, verify_checksums=True)
        with loader, pytest.raises(ShardFormatError, match=r"part-0.parquet: row group 0 .*page 15 \(rows 60-63\)"):
            loader.set_epoch(0)
            for batch in loader:
                seen += [bytes(b) for b in batch["blob"]]
        assert seen == blobs[: len(seen)] and len(seen) <= first


def test_verify_checksums_false_does_no_page_work(tmp_path, monkeypatch):
    store, _ = big_dataset(tmp_path / "ds")
    flip_page_of_row(store, 30)

    def refuse(*args, **kwargs):
        raise AssertionError("checked though verify_checksums=False")

    monkeypatch.setattr(page_check, "parse_page_header", refuse)
    monkeypatch.setattr(page_check.PageCheck, "__init__", refuse)
    delivered: list[bytes] = []
    read_slices(ParquetReader(store, read_manifest(store), slice_bytes=SLICE_BYTES), delivered)
    assert len(delivered) == ROWS
    with pytest.raises(AssertionError, match="checked though"):  # the patch does bite when checking
        read_slices(ParquetReader(store, read_manifest(store), slice_bytes=SLICE_BYTES, verify_checksums=True), [])


def test_a_changed_page_header_is_caught_at_the_chunks_end_the_known_gap(tmp_path):
    """A page header is outside its CRC: one saying 3 values instead of 4 decodes, shifting the rows
    after it, and is caught only by the chunk's xxh3 when the stream reads the chunk's last byte
    (README and DESIGN say so); shardify verify catches it whole."""
    store, blobs = big_dataset(tmp_path / "ds")
    path = store.path("part-0.parquet")
    data = Path(path).read_bytes()
    begin, _, _, _ = pages_of(data, "blob")[7]  # rows 28-31
    header = data[begin - 31 : begin]  # the 31-byte header before the page's data
    at = begin - 31 + header.index(bytes([0x1C, 0x15, 0x08]))  # data_page_header { num_values: 4 }
    with open(path, "r+b") as f:
        f.seek(at + 2)
        f.write(bytes([0x06]))  # num_values: 3
    delivered: list[bytes] = []
    with pytest.raises(ShardFormatError, match="a page header changed"):
        read_slices(ParquetReader(store, read_manifest(store), slice_bytes=SLICE_BYTES, verify_checksums=True),
                    delivered)
    assert delivered[:31] == blobs[:31] and delivered[31:] != blobs[31 : len(delivered)]  # the gap


# --- the disk cache -------------------------------------------------------------------------


def test_a_changed_cache_block_is_dropped_and_read_again(tmp_path):
    store, blobs = big_dataset(tmp_path / "ds")
    m = read_manifest(store)
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1 << 26)
    delivered: list[bytes] = []
    read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, cache=cache, verify_checksums=True), delivered)
    assert delivered == blobs and cache.stats.misses == 1  # the 3.8 MB file is one block, one entry
    # Change a byte of row 30's page inside the entry and re-seal its digest: the cache's own check passes.
    data = Path(store.path("part-0.parquet")).read_bytes()
    begin, end, _, _ = next(p for p in pages_of(data, "blob") if p[0] > 28 * VALUE_BYTES)
    entry = Path(cache.entry_path(namespace=store.url, path="part-0.parquet", start=0, end=len(data),
                                  checksum=m.shard_checksums[0]))
    body = bytearray(entry.read_bytes()[:-DIGEST_BYTES])
    body[(begin + end) // 2] ^= 0x5A
    entry.write_bytes(bytes(body) + xxhash.xxh3_64_digest(bytes(body)))
    quiet: list[bytes] = []
    read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, cache=DiskCache(cache.directory, limit_bytes=1 << 26)),
                quiet)
    assert quiet != blobs  # unchecked: the changed entry is served
    delivered = []
    read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, cache=cache, verify_checksums=True), delivered)
    assert delivered == blobs and cache.stats.refused == 1  # the store's bytes, not the entry's
    delivered = []
    read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, cache=cache, verify_checksums=True), delivered)
    assert delivered == blobs and cache.stats.refused == 1  # cached again, intact


def test_a_changed_shard_behind_a_cache_still_fails(tmp_path):
    store, _ = big_dataset(tmp_path / "ds")
    flip_page_of_row(store, 50)
    reader = ParquetReader(store, read_manifest(store), slice_bytes=SLICE_BYTES,
                           cache=DiskCache(str(tmp_path / "c"), limit_bytes=1 << 26), verify_checksums=True)
    with pytest.raises(ShardFormatError, match=r"page 12 \(rows 48-51\)"):
        read_slices(reader, [])


# --- files without page CRCs (Hugging Face exports, most Parquet) ---------------------------


def test_without_page_crcs_a_chunk_is_checked_whole_before_its_rows(tmp_path):
    store, blobs = big_dataset(tmp_path / "ds", crc=False)
    m = read_manifest(store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        delivered: list[bytes] = []
        read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, verify_checksums=True), delivered)
    notes = [w for w in caught if issubclass(w.category, VerifyCostWarning)]
    assert delivered == blobs and len(notes) == 1 and "read twice" in str(notes[0].message)
    flip_page_of_row(store, 80)  # near the chunk's end
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VerifyCostWarning)
        delivered = []
        with pytest.raises(ShardFormatError) as err:
            read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, verify_checksums=True), delivered)
    assert delivered == []  # the first slice already: the chunk was checked whole before its first row
    assert "column 'blob', does not match its checksum (checked whole before any row" in str(err.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VerifyCostWarning)  # verify_checksums=False: no note, no second read
        read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES), [])


@pytest.mark.slow
def test_slices_from_s3_are_checked_and_cached(s3_server, tmp_path):
    """Over S3: slices read in aligned blocks through the disk cache (a second epoch all hits), and a
    shard rewritten with one changed byte (same size) fails at its page."""
    store, blobs = big_dataset(Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options()))
    m = read_manifest(store)
    cache = DiskCache(str(tmp_path / "c"), limit_bytes=1 << 26)
    for _ in range(2):
        delivered: list[bytes] = []
        read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, cache=cache, verify_checksums=True), delivered)
        assert delivered == blobs
    assert cache.stats.hits == cache.stats.misses == 1
    data = bytearray(store.read("part-0.parquet"))
    begin, end, _, _ = pages_of(bytes(data), "blob")[10]  # rows 40-43
    data[(begin + end) // 2] ^= 1
    store.write_bytes("part-0.parquet", bytes(data))
    with pytest.raises(ShardFormatError, match=r"page 10 \(rows 40-43\)"):
        read_slices(ParquetReader(store, m, slice_bytes=SLICE_BYTES, verify_checksums=True), [])
