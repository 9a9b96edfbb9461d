"""The per-shard tar index: built from real tars (tarfile, webdataset), spans, and parse errors."""

from __future__ import annotations

import io
import tarfile

import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

from dataio import ShardFormatError
from dataio.format.tar_index import (
    TAR_BLOCK,
    IndexedSample,
    Member,
    TarIndex,
    build_index,
    _parse_lines,
    parse_index,
    split_member_name,
)
from dataio.readers.tar_raw import _columns_by_sample, columns_of


def _samples(num: int) -> list[dict[str, bytes]]:
    # Deliberately varied sizes: some members end exactly on a block, some span several.
    return [
        {"__key__": f"{i:06d}", "jpg": bytes([i % 251]) * (300 + 700 * i), "cls": str(i % 7).encode(),
         "json": b'{"i": %d}' % i}
        for i in range(9)
    ] + [{"__key__": "000009", "jpg": b"z" * TAR_BLOCK, "cls": b"1", "json": b"{}"}]


def _tar_with_tarfile(samples, fmt=tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for sample in samples:
            for ext, data in sample.items():
                if ext == "__key__":
                    continue
                info = tarfile.TarInfo(f"{sample['__key__']}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tar_with_webdataset(samples) -> bytes:
    buf = io.BytesIO()
    with wds.TarWriter(buf, encoder=False, mtime=0) as writer:
        for sample in samples:
            writer.write(dict(sample))
    return buf.getvalue()


def _check_index_matches(raw: bytes, index: TarIndex, samples) -> None:
    assert [s.key for s in index.samples] == [s["__key__"] for s in samples]
    for indexed, sample in zip(index.samples, samples):
        got = {m.ext: raw[m.offset : m.offset + m.size] for m in indexed.members}
        assert got == {k: v for k, v in sample.items() if k != "__key__"}


@pytest.mark.parametrize("make", [_tar_with_tarfile, _tar_with_webdataset], ids=["tarfile", "webdataset"])
def test_build_index_points_at_every_member(make):
    samples = _samples(10)
    raw = make(samples)
    index = build_index(io.BytesIO(raw))
    assert len(index) == 10
    _check_index_matches(raw, index, samples)
    assert parse_index(index.dumps()) == index  # the text form round-trips
    assert index.dumps().startswith(b"v1.2 10\n")


def test_pax_long_names_keep_correct_data_offsets():
    samples = [{"__key__": "d" * 150 + f"/{i:04d}", "jpg": b"j" * (i + 1), "cls": b"2"} for i in range(3)]
    raw = _tar_with_tarfile(samples, fmt=tarfile.PAX_FORMAT)
    index = build_index(io.BytesIO(raw))
    _check_index_matches(raw, index, samples)


def test_directories_and_hidden_files_are_skipped():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        d = tarfile.TarInfo("train")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in (("train/.DS_Store", b"junk"), ("train/a1.jpg", b"A"), ("train/a1.cls", b"1"),
                           ("train/b2.jpg", b"B")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    index = build_index(io.BytesIO(buf.getvalue()))
    assert [s.key for s in index.samples] == ["train/a1", "train/b2"]
    assert [m.ext for m in index.samples[0].members] == ["jpg", "cls"]


def test_span_covers_exactly_the_requested_samples():
    samples = _samples(10)
    raw = _tar_with_webdataset(samples)
    index = build_index(io.BytesIO(raw))
    for first, stop in [(0, 1), (0, 10), (3, 7), (9, 10)]:
        start, end = index.span(first, stop)
        chunk = raw[start:end]
        assert start == index.samples[first].members[0].offset
        assert end == max(m.offset + m.size for m in index.samples[stop - 1].members)
        for indexed in index.samples[first:stop]:  # every member readable from the one ranged read
            for m in indexed.members:
                assert chunk[m.offset - start : m.offset - start + m.size] == raw[m.offset : m.offset + m.size]
        assert index.samples[first].start == start - TAR_BLOCK
        assert index.samples[stop - 1].end % TAR_BLOCK == 0 and index.samples[stop - 1].end >= end
    for first, stop in [(0, 0), (-1, 2), (5, 11), (7, 3)]:
        with pytest.raises(ValueError):
            index.span(first, stop)


def test_truncated_and_damaged_tars_are_refused():
    raw = _tar_with_tarfile(_samples(10))
    for cut in (100, 700, len(raw) // 2 + 37):
        with pytest.raises(ShardFormatError, match="shard.tar"):
            build_index(io.BytesIO(raw[:cut]), url="s3://b/shard.tar")
    damaged = bytearray(raw)
    second = build_index(io.BytesIO(raw)).samples[1].members[0].offset - TAR_BLOCK
    damaged[second + 5] ^= 0xFF  # breaks the header checksum of a member mid-archive
    with pytest.raises(ShardFormatError, match="truncated or damaged at byte"):
        build_index(io.BytesIO(bytes(damaged)))
    with pytest.raises(ShardFormatError):
        build_index(io.BytesIO(b"this is not a tar file at all" * 40))


def test_member_names_the_index_cannot_hold_are_refused():
    for name, match in (("has space.jpg", "whitespace"), ("noext", "KEY.EXT")):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(ShardFormatError, match=match):
            build_index(io.BytesIO(buf.getvalue()), url="s3://b/s.tar")


def test_split_member_name_follows_webdataset():
    assert split_member_name("a/b/000123.seg.png") == ("a/b/000123", "seg.png")
    assert split_member_name("x.y/k.jpg") == ("x.y/k", "jpg")
    for bad in ("nodot", ".hidden", "trailing."):
        with pytest.raises(ValueError):
            split_member_name(bad)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"v1.1 1\njpg 512 3 a.jpg\n",  # another version
        b"v1.2 2\njpg 512 3 a.jpg\n",  # count does not match
        b"v1.2 1\njpg 512 3\n",  # not groups of four
        b"v1.2 1\njpg x 3 a.jpg\n",  # not an integer
        b"v1.2 1\njpg 512 3 noext\n",  # member name without KEY.EXT
        b"\xff\xfe\n",  # not text
    ],
)
def test_malformed_index_is_refused_with_its_url(data):
    with pytest.raises(ShardFormatError, match=r"s3://b/shard-000001.idx: malformed tar index"):
        parse_index(data, url="s3://b/shard-000001.idx")


def test_parse_accepts_dali_style_lines():
    index = parse_index(b"v1.2 2\njpg 512 10 k1.jpg cls 1536 1 k1.cls\n\njpg 2560 5 k2.jpg\n")
    assert index.samples[0] == IndexedSample("k1", (Member("jpg", 512, 10), Member("cls", 1536, 1)))
    assert index.span(0, 2) == (512, 2565)


# ---- the columnar parse (parse_index's fast path) against the line parser, its reference
_NAME = st.text(alphabet="ab.0/_-", min_size=1, max_size=6)
_LINE_MEMBERS = st.lists(st.tuples(st.sampled_from(["jpg", "cls", "json", "png"]), st.integers(0, 2**40),
                                   st.integers(0, 2**31)), min_size=1, max_size=4)


@st.composite
def _index_texts(draw) -> bytes:
    """Index texts, mostly well formed (keys with dots and directories, samples alike or not, a
    field twice in a sample), some not (doubled or trailing spaces, blank lines, CR, signs, a
    wrong count, a name without KEY.EXT)."""
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        key = draw(_NAME)
        lines.append(" ".join(f"{e} {o} {z} {key}.{e}" for e, o, z in draw(_LINE_MEMBERS)))
    count = len(lines) + draw(st.sampled_from([0, 0, 0, 0, 1]))
    text = "\n".join([f"v1.2 {count}", *lines]) + "\n"
    damage = draw(st.sampled_from([None] * 6 + ["  ", " \n", "\n\n", "\r\n", " +", "_", "x.", "\t"]))
    if damage is not None and lines:
        at = draw(st.integers(len(f"v1.2 {count}\n"), len(text) - 1))
        text = text[:at] + damage + text[at:]
    return text.encode()


@settings(max_examples=400, deadline=None)
@given(_index_texts())
def test_the_columnar_parse_agrees_with_the_line_parser(data):
    try:
        want = _parse_lines(data, url="u")
    except ShardFormatError as exc:
        with pytest.raises(ShardFormatError) as got:
            parse_index(data, url="u")
        assert str(got.value) == str(exc)  # the same message: the line parser names the fault
        return
    got = parse_index(data, url="u")
    assert got == want and got.samples == want.samples
    if len(want):
        assert got.span(0, len(got)) == want.span(0, len(want))
        for fields in (None, ("jpg",), ("cls", "jpg"), ("nothing",)):
            a, b = columns_of(got, fields), _columns_by_sample(want, fields)
            assert a.exts == b.exts and list(a.keys) == list(b.keys)
            assert (a.offsets == b.offsets).all() and (a.sizes == b.sizes).all() and (a.ranks == b.ranks).all()


def test_a_parsed_index_makes_no_object_per_sample_until_asked():
    text = b"v1.2 2\njpg 512 10 k1.jpg cls 1536 1 k1.cls\njpg 2560 5 k2.jpg cls 3584 1 k2.cls\n"
    index = parse_index(text)
    assert index._samples is None and len(index) == 2 and index.span(0, 2) == (512, 3585)
    assert list(index.columns.starts) == [512, 2560] and list(index.columns.ends) == [1537, 3585]
    assert index.samples[1] == IndexedSample("k2", (Member("jpg", 2560, 5), Member("cls", 3584, 1)))
    assert parse_index(index.dumps()) == index
