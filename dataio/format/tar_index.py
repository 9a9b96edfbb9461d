"""The per-shard sample index of a tar shard, in DALI's `wds2idx` v1.2 text format.

One header line `v1.2 NUM_SAMPLES`, then one line per sample, in tar order:
`EXT DATA_OFFSET SIZE MEMBER_NAME [EXT DATA_OFFSET SIZE MEMBER_NAME ...]`, where DATA_OFFSET is
where the member's bytes start (after its 512-byte header). Using DALI's own format means
`fn.readers.webdataset(index_paths=...)` reads our index as is, and our readers slice any run of
samples out of one ranged read without parsing tar headers.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataio.errors import ShardFormatError

INDEX_VERSION = "v1.2"
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


@dataclass(frozen=True, slots=True)
class TarIndex:
    samples: tuple[IndexedSample, ...]

    def __len__(self) -> int:
        return len(self.samples)

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """The byte range [start, end) holding every member's data of samples [first, stop)."""
        if not 0 <= first < stop <= len(self.samples):
            raise ValueError(f"sample range [{first}, {stop}) is outside 0..{len(self.samples)}")
        return self.samples[first].members[0].offset, max(
            m.offset + m.size for m in self.samples[stop - 1].members
        )

    def dumps(self) -> bytes:
        lines = [f"{INDEX_VERSION} {len(self.samples)}"]
        for s in self.samples:
            lines.append(" ".join(f"{m.ext} {m.offset} {m.size} {s.key}.{m.ext}" for m in s.members))
        return ("\n".join(lines) + "\n").encode()


def split_member_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is everything before the first dot of the basename."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot <= 0 or dot == len(name) - 1:
        raise ValueError(f"tar member {name!r} has no KEY.EXT form")
    return name[:dot], name[dot + 1 :]


def parse_index(data: bytes, *, url: str = "index") -> TarIndex:
    """Parse a v1.2 index; ShardFormatError naming `url` when it is malformed."""
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
