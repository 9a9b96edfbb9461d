"""The per-shard sample index of a tar shard, in DALI's `wds2idx` v1.2 text format.

One header line `v1.2 NUM_SAMPLES`, then one line per sample, in tar order:
`EXT DATA_OFFSET SIZE MEMBER_NAME [EXT DATA_OFFSET SIZE MEMBER_NAME ...]`, where DATA_OFFSET is
where the member's bytes start (after its 512-byte header). Using DALI's own format means
`fn.readers.webdataset(index_paths=...)` reads our index as is, and our readers slice any run of
samples out of one ranged read without parsing tar headers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataio.errors import ShardFormatError

INDEX_VERSION = "v1.2"
# Memory per key (a short str and its list slot), per IndexedSample and per Member object: estimates
# for caches' byte bounds (CPython 3.11, 64-bit).
_KEY_BYTES, _SAMPLE_BYTES, _MEMBER_BYTES = 64, 120, 140
TAR_BLOCK = 512


@dataclass(frozen=True, slots=True)
class Member:
    """One tar member of a sample: its field (extension), data offset and size in bytes."""

    ext: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class IndexedSample:
    key: str
    members: tuple[Member, ...]

    @property
    def start(self) -> int:
        """First byte of the sample's header block(s), assuming plain 512-byte ustar headers."""
        return self.members[0].offset - TAR_BLOCK

    @property
    def end(self) -> int:
        """One past the sample's last data byte, padded to the tar block."""
        last = self.members[-1]
        return last.offset + -(-last.size // TAR_BLOCK) * TAR_BLOCK


class TarIndex:
    """A tar shard's samples in order, each with its members (field, data offset, size).

    Two forms behind one API: per-sample objects (`samples`: what the writer and build_index make,
    and what verify, inspect and sample parsing walk) and columns (`columns`: numpy arrays per
    member and per sample, what the RAW path and the checksum spans need). An index parsed from
    text (parse_index) is columns only, made without a Python object per sample; its `samples`
    are made on first use. Either form is made from the other on demand, once.
    """

    __slots__ = ("_samples", "_columns")

    def __init__(self, samples: tuple[IndexedSample, ...] | None = None, *,
                 columns: IndexColumns | None = None) -> None:
        if (samples is None) == (columns is None):
            raise TypeError("TarIndex takes samples or columns, one of them")
        self._samples = tuple(samples) if samples is not None else None
        self._columns = columns

    @property
    def samples(self) -> tuple[IndexedSample, ...]:
        if self._samples is None:
            self._samples = self._columns.samples()  # type: ignore[union-attr]
        return self._samples

    @property
    def columns(self) -> IndexColumns:
        if self._columns is None:
            self._columns = IndexColumns.of(self._samples)  # type: ignore[arg-type]
        return self._columns

    @property
    def nbytes(self) -> int:
        """About how much memory the index holds (for a cache's byte bound)."""
        n = len(self)
        total = self._columns.nbytes if self._columns is not None else 0
        if self._samples is not None:
            total += n * (_SAMPLE_BYTES + _MEMBER_BYTES * len(self._samples[0].members) if n else 0)
        return total

    def __len__(self) -> int:
        if self._samples is not None:
            return len(self._samples)
        return len(self._columns.keys)  # type: ignore[union-attr]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TarIndex) and self.samples == other.samples

    def __hash__(self) -> int:
        return hash(self.samples)

    def __repr__(self) -> str:
        return f"TarIndex({len(self)} samples)"

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """The byte range [start, end) holding every member's data of samples [first, stop)."""
        if not 0 <= first < stop <= len(self):
            raise ValueError(f"sample range [{first}, {stop}) is outside 0..{len(self)}")
        if self._columns is None:
            samples = self._samples
            return samples[first].members[0].offset, max(m.offset + m.size for m in samples[stop - 1].members)
        return int(self._columns.starts[first]), int(self._columns.ends[stop - 1])

    def dumps(self) -> bytes:
        lines = [f"{INDEX_VERSION} {len(self.samples)}"]
        for s in self.samples:
            lines.append(" ".join(f"{m.ext} {m.offset} {m.size} {s.key}.{m.ext}" for m in s.members))
        return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True, slots=True)
class IndexColumns:
    """An index as arrays: member j (in tar order) belongs to sample member_sample[j], has field
    exts[member_ext[j]], data offset member_offset[j] and size member_size[j]; sample i has key
    keys[i] and its members' data lie in [starts[i], ends[i]) (the first member's offset, the
    largest member end). exts lists the fields in order of first appearance."""

    keys: list[str]
    exts: tuple[str, ...]
    member_sample: np.ndarray  # int64 [M], non-decreasing
    member_ext: np.ndarray  # int64 [M]
    member_offset: np.ndarray  # int64 [M]
    member_size: np.ndarray  # int64 [M]
    starts: np.ndarray  # int64 [n]
    ends: np.ndarray  # int64 [n]

    @property
    def nbytes(self) -> int:
        arrays = (self.member_sample, self.member_ext, self.member_offset, self.member_size, self.starts, self.ends)
        return sum(a.nbytes for a in arrays) + _KEY_BYTES * len(self.keys)

    @classmethod
    def build(cls, keys: list[str], ext_names: list[str], counts: np.ndarray, offsets: np.ndarray,
              sizes: np.ndarray) -> IndexColumns:
        """From per-member fields (ext_names, offsets, sizes, in tar order) and members per sample
        (counts, each at least 1)."""
        ids: dict[str, int] = {}
        pattern = ext_names[: int(counts[0])] if len(counts) else []
        if (counts == len(pattern)).all() and ext_names == pattern * len(counts):  # every sample alike (usual)
            member_ext = np.tile(np.array([ids.setdefault(e, len(ids)) for e in pattern], dtype=np.int64), len(counts))
        else:
            member_ext = np.fromiter((ids.setdefault(e, len(ids)) for e in ext_names), dtype=np.int64,
                                     count=len(ext_names))
        first = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        member_sample = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        if len(counts):
            starts, ends = offsets[first], np.maximum.reduceat(offsets + sizes, first)
        else:
            starts = ends = np.empty(0, dtype=np.int64)
        return cls(keys, tuple(ids), member_sample, member_ext, offsets, sizes, starts, ends)

    @classmethod
    def of(cls, samples: tuple[IndexedSample, ...]) -> IndexColumns:
        members = [m for s in samples for m in s.members]
        return cls.build([s.key for s in samples], [m.ext for m in members],
                         np.fromiter((len(s.members) for s in samples), dtype=np.int64, count=len(samples)),
                         np.fromiter((m.offset for m in members), dtype=np.int64, count=len(members)),
                         np.fromiter((m.size for m in members), dtype=np.int64, count=len(members)))

    def samples(self) -> tuple[IndexedSample, ...]:
        exts = [self.exts[e] for e in self.member_ext.tolist()]
        members = [Member(e, o, z) for e, o, z in zip(exts, self.member_offset.tolist(), self.member_size.tolist())]
        bounds = np.searchsorted(self.member_sample, np.arange(len(self.keys) + 1)).tolist()
        return tuple(IndexedSample(k, tuple(members[a:b])) for k, a, b in zip(self.keys, bounds, bounds[1:]))


def split_member_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is everything before the first dot of the basename."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot <= 0 or dot == len(name) - 1:
        raise ValueError(f"tar member {name!r} has no KEY.EXT form")
    return name[:dot], name[dot + 1 :]


def parse_index(data: bytes, *, url: str = "index") -> TarIndex:
    """Parse a v1.2 index; ShardFormatError naming `url` when it is malformed.

    Well-formed text is parsed into columns in a few C-level passes (split, int, numpy: about a
    microsecond per sample, a tenth of an object per member); anything unusual (a malformed line,
    CR or tab characters, a count that does not add up) goes through the line-by-line parser,
    the reference for what is valid, which names what is wrong.
    """
    columns = _parse_columns(data)
    if columns is not None:
        return TarIndex(columns=columns)
    return _parse_lines(data, url=url)


_ODD = "\r\t\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # other whitespace and line breaks (str.splitlines')


def _parse_columns(data: bytes) -> IndexColumns | None:
    """The index as columns, or None where the text is anything but plain well-formed lines."""
    head, _, body = data.partition(b"\n")
    fields = head.split(b" ")
    if len(fields) != 2 or fields[0] != INDEX_VERSION.encode() or not fields[1].isdigit():
        return None
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    if any(c in text for c in _ODD):
        return None
    # Tokens per line from where the spaces and line breaks are (numpy, no loop per line); a
    # token count that str.split disagrees with means doubled, leading or other spaces: not plain.
    raw = np.frombuffer(body, dtype=np.uint8)
    breaks, spaces = np.flatnonzero(raw == 10), np.flatnonzero(raw == 32)
    starts, ends = np.concatenate([[0], breaks + 1]), np.concatenate([breaks, [len(raw)]])
    lines = ends > starts
    counts = (np.searchsorted(spaces, ends) - np.searchsorted(spaces, starts) + 1)[lines]
    tokens = text.split()
    if int(fields[1]) != len(counts) or (counts % 4).any() or len(tokens) != counts.sum():
        return None
    names = tokens[3::4]
    firsts = names if (counts == 4).all() else [names[i] for i in (np.cumsum(counts // 4) - counts // 4).tolist()]
    try:
        if "/" in text:
            keys = [split_member_name(name)[0] for name in firsts]
        else:  # WebDataset's rule, faster: up to the first dot
            keys = [name.partition(".")[0] for name in firsts]
            if not all(keys) or any(len(k) >= len(n) - 1 for k, n in zip(keys, firsts)):
                return None  # a name without KEY.EXT form: the line parser names it
        numbers = (tokens[1::4], tokens[2::4])
        if not all("".join(column).isascii() and "".join(column).isdigit() for column in numbers):
            return None  # signs, underscores, other digits: int() decides, in the line parser
        offsets, sizes = (np.array(column, dtype=np.int64) for column in numbers)
    except (ValueError, OverflowError):
        return None
    return IndexColumns.build(keys, tokens[0::4], counts // 4, offsets, sizes)


def _parse_lines(data: bytes, *, url: str) -> TarIndex:
    """The line-by-line parser: the reference for what is valid, and the one that names a fault."""
    try:
        lines = data.decode().splitlines()
        version, count = lines[0].split()
        if version != INDEX_VERSION:
            raise ValueError(f"index version {version!r}, expected {INDEX_VERSION!r}")
        samples = []
        for line in lines[1:]:
            if not line:
                continue
            parts = line.split(" ")
            if len(parts) % 4:
                raise ValueError(f"line {line[:80]!r} is not groups of EXT OFFSET SIZE NAME")
            members = tuple(
                Member(parts[i], int(parts[i + 1]), int(parts[i + 2])) for i in range(0, len(parts), 4)
            )
            key = split_member_name(parts[3])[0]
            samples.append(IndexedSample(key, members))
        if len(samples) != int(count):
            raise ValueError(f"header says {count} samples, found {len(samples)}")
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise ShardFormatError(
            f"{url}: malformed tar index ({exc}); recreate it with `shardify write` or DALI's wds2idx"
        ) from None
    return TarIndex(tuple(samples))


def build_index(fileobj, *, url: str = "tar") -> TarIndex:  # noqa: ANN001 - any seekable binary file
    """Index an existing tar (e.g. one written by webdataset's ShardWriter), grouping members by key.

    Consecutive members sharing a key form one sample, as WebDataset groups them; directories,
    links and hidden files are skipped. Raises ShardFormatError (naming `url`) on a truncated,
    damaged or non-tar file, and on member names the index format cannot hold (whitespace).
    """
    import tarfile

    samples: list[IndexedSample] = []
    members: list[Member] = []
    last_key = None
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            for info in tar:
                if not info.isreg():
                    continue
                base = info.name.rsplit("/", 1)[-1]
                if base.startswith("."):
                    continue
                if any(c.isspace() for c in info.name):
                    raise ShardFormatError(
                        f"{url}: member {info.name!r} has whitespace in its name, which the sample "
                        "index cannot hold; rename the files before sharding"
                    )
                key, ext = split_member_name(info.name)
                if key != last_key and members:
                    samples.append(IndexedSample(last_key, tuple(members)))  # type: ignore[arg-type]
                    members = []
                last_key = key
                members.append(Member(ext, info.offset_data, info.size))
            _check_clean_end(tar, fileobj, url)
    except (tarfile.TarError, ValueError, EOFError) as exc:
        raise ShardFormatError(f"{url}: not a readable tar shard ({exc}); re-create it") from None
    if members:
        samples.append(IndexedSample(last_key, tuple(members)))  # type: ignore[arg-type]
    return TarIndex(tuple(samples))


def _check_clean_end(tar, fileobj, url: str) -> None:  # noqa: ANN001
    """Python's tarfile stops silently at a damaged or cut-off header; refuse that instead.

    After the last member a tar holds its end-of-archive zero blocks (or, from some writers,
    nothing): any other byte there means the file was truncated or corrupted mid-archive.
    """
    end = tar.offset  # where the header after the last member would start
    fileobj.seek(end)
    block = fileobj.read(TAR_BLOCK)
    if block.strip(b"\0"):
        raise ShardFormatError(
            f"{url}: tar is truncated or damaged at byte {end} (a header there does not parse); "
            "re-create or re-download the shard"
        )
