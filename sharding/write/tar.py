"""Write one WebDataset tar shard: plain ustar members KEY.EXT, deterministic headers, and its index.

Headers carry mtime 0, uid/gid 0 and no user names, so the same samples give the same bytes on
any machine. Offsets are recorded while writing, so the v1.2 index (DALI's wds2idx format)
comes for free instead of re-reading the tar, and so do the per-sample checksums of the
`.sums` sidecar (format/checksums.py: each sample's bytes from its first member's data to its
last member's data end).
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO

import xxhash

from dataio.format.manifest import Checksummer
from dataio.format.tar_index import TAR_BLOCK, IndexedSample, Member, TarIndex

_ZEROS = bytes(TAR_BLOCK)


# The fixed part of every header: mode 0644, uid/gid 0, mtime 0, regular file, ustar magic, empty
# user, group and device fields -- exactly what tarfile writes for such a TarInfo.
_TEMPLATE = bytearray(TAR_BLOCK)
_TEMPLATE[100:108] = b"0000644\0"
_TEMPLATE[108:116] = b"0000000\0"
_TEMPLATE[116:124] = b"0000000\0"
_TEMPLATE[136:148] = b"00000000000\0"
_TEMPLATE[148:156] = b" " * 8  # the checksum is computed with its own field as spaces
_TEMPLATE[156:157] = b"0"
_TEMPLATE[257:265] = b"ustar\x0000"
_TEMPLATE_SUM = sum(_TEMPLATE)


def member_header(name: str, size: int) -> bytes:
    """A 512-byte ustar header for a regular file, byte-identical to tarfile's; ValueError if it cannot fit."""
    raw = name.encode()
    if len(raw) > 100 or size >= 8**11:
        return _tarfile_header(name, size)  # long names (prefix field) and huge sizes: tarfile's rules
    size_field = b"%011o\0" % size
    header = bytearray(_TEMPLATE)
    header[: len(raw)] = raw
    header[124:136] = size_field
    checksum = _TEMPLATE_SUM + sum(raw) + sum(size_field)
    header[148:155] = b"%06o\0" % checksum
    return bytes(header)


def _tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    try:
        header = info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
    except ValueError as exc:
        raise ValueError(f"tar member name {name!r} does not fit a ustar header ({exc}); use shorter keys (--key index, the default, numbers them)") from None
    assert len(header) == TAR_BLOCK, "ustar header of a plain name is one block"
    return header


class TarShardWriter:
    """Appends samples to `fileobj` as tar members; `close()` ends the tar and returns its index."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._f = fileobj
        self.checksum = Checksummer()
        self._samples: list[IndexedSample] = []
        self.sums: list[int] = []  # per sample, xxh3-64 of its data span (the .sums sidecar)

    @property
    def num_bytes(self) -> int:
        return self.checksum.num_bytes

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self.checksum.update(data)

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Write one sample: `members` are (ext, bytes), written as KEY.EXT in the given order."""
        if not members:
            raise ValueError(f"sample {key!r} has no members")
        written = []
        span = xxhash.xxh3_64()  # from the first member's data to the last one's end: no outer header or pad
        pad = b""
        for i, (ext, data) in enumerate(members):
            header = member_header(f"{key}.{ext}", len(data))
            self._write(header)
            if i:
                span.update(pad)
                span.update(header)
            written.append(Member(ext, self.num_bytes, len(data)))
            self._write(data)
            span.update(data)
            pad = _ZEROS[: -len(data) % TAR_BLOCK]
            if pad:
                self._write(pad)
        self._samples.append(IndexedSample(key, tuple(written)))
        self.sums.append(span.intdigest())

    def close(self) -> TarIndex:
        """Write the two zero blocks that end a tar; returns the index of every sample written."""
        self._write(_ZEROS + _ZEROS)
        return TarIndex(tuple(self._samples))
