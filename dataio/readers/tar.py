"""Tar segments: one ranged read per segment, members sliced out by the shard's index.

The index (DALI v1.2 text beside each shard) gives every member's data offset and size, so
samples [start, stop) are exactly the bytes TarIndex.span(start, stop): one request, no tar
header parsing, no temporary files. Indexes are checked against the manifest (size, checksum,
sample count) and kept in a small per-reader LRU. With verify_checksums, every sample read is
checked against its checksum in the shard's sidecar (format/checksums.py), itself checked
against the manifest; a cache entry that fails is dropped and read again from the store once.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dataio.errors import ShardFormatError, StorageError
from dataio.format.checksums import FIX, SampleSums, parse_sums, sums_bytes, sums_path
from dataio.format.manifest import Manifest, checksum_bytes
from dataio.format.tar_index import IndexedSample, TarIndex, parse_index
from dataio.readers.base import (
    METADATA_CACHE_BYTES,
    LruCache,
    Sample,
    SegmentLike,
    cached_read,
    check_fields,
    check_segment,
    check_shard_size,
    nbytes_of,
    proportional_bytes,
    shard_offsets,
)
from dataio.storage.store import Store

if TYPE_CHECKING:
    from dataio.storage.cache import DiskCache

INDEX_CACHE_SHARDS = 64
INDEX_CACHE_BYTES = METADATA_CACHE_BYTES  # the index, checksum and RAW column caches' byte bound
THREAD_NAME_PREFIX = "dataio-tar-sums"


@dataclass(frozen=True, slots=True)
class TarPayload:
    """What fetch hands to parse: bytes [base, base + len(data)) of the shard and the samples in it."""

    base: int
    data: bytes
    samples: tuple[IndexedSample, ...]

    def __len__(self) -> int:
        return len(self.data)


class TarReader:
    """SegmentReader for tar shards with a v1.2 index beside each shard."""

    def __init__(
        self,
        store: Store,
        manifest: Manifest,
        *,
        fields: Sequence[str] | None = None,
        verify_index: bool = True,
        cache: DiskCache | None = None,
        verify_checksums: bool = False,
    ) -> None:
        """verify_checksums: check every sample read against the shard's per-sample checksums
        (shards written without them, by a manifest before version 3, are read unchecked)."""
        if manifest.format != "tar":
            raise ValueError(f"TarReader needs a tar manifest, got format {manifest.format!r}")
        self.store = store
        self.manifest = manifest
        self.fields = check_fields(manifest, fields)
        self.verify_index = verify_index
        self.cache = cache
        self._offsets = shard_offsets(manifest)
        self._indexes = LruCache(INDEX_CACHE_SHARDS, max_bytes=INDEX_CACHE_BYTES, size_of=nbytes_of)
        self.verify_checksums = verify_checksums and manifest.has_read_checksums
        self._sums = LruCache(INDEX_CACHE_SHARDS, max_bytes=INDEX_CACHE_BYTES, size_of=nbytes_of)

    def index(self, shard: int) -> TarIndex:
        """The shard's index, fetched once and checked against the manifest."""
        return self._indexes.get_or_load(shard, lambda: self._load_index(shard))

    def _load_index(self, shard: int) -> TarIndex:
        """The index, checked; with verify_checksums from object storage its checksum sidecar too,
        fetched side by side (both are small: a shard's start then costs one round trip, not two in
        a row; a local file system has no round trip worth a thread)."""
        check_shard_size(self.store, self.manifest, shard, on_read=True)  # fetch's reads pass object_size
        if not self.store.is_local and self.sample_sums_expected(shard) and self._sums.get(shard) is None:
            with ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME_PREFIX) as pool:
                sums = pool.submit(self._sums_of, shard)
                index = self._index_of(shard)
                self._sums.get_or_load(shard, lambda: SampleSums.of_index(sums.result(), index))
            return index
        return self._index_of(shard)

    def _index_of(self, shard: int) -> TarIndex:
        m = self.manifest
        rel = m.index_paths[shard]
        url = self.store.url_of(rel)
        data = self.store.read(rel)
        if self.verify_index:
            if len(data) != m.index_num_bytes[shard]:
                raise ShardFormatError(
                    f"{url}: index is {len(data)} bytes but the manifest says {m.index_num_bytes[shard]}; "
                    "the index or the manifest was replaced: rewrite the dataset with `shardify write`"
                )
            if checksum_bytes(data) != m.index_checksums[shard]:
                raise ShardFormatError(
                    f"{url}: index checksum {checksum_bytes(data)} does not match the manifest's "
                    f"{m.index_checksums[shard]}; the index is damaged or stale: rewrite the dataset"
                )
        index = parse_index(data, url=url)
        if len(index) != m.shard_num_samples[shard]:
            raise ShardFormatError(
                f"{url}: index lists {len(index)} samples but the manifest says "
                f"{m.shard_num_samples[shard]} for {m.shard_paths[shard]}; rewrite the dataset"
            )
        if len(index) and index.span(0, len(index))[1] > m.shard_num_bytes[shard]:
            raise ShardFormatError(
                f"{url}: index points past the end of {m.shard_paths[shard]} "
                f"({m.shard_num_bytes[shard]} bytes in the manifest); rewrite the dataset"
            )
        return index

    def payload_bytes(self, seg: SegmentLike) -> int:
        """Exact span size when the index is loaded, else the shard's size scaled to the segment."""
        check_segment(self.manifest, seg)
        if seg.stop <= seg.start:
            return 0
        index = self._indexes.get(seg.shard)
        if index is None:
            return proportional_bytes(self.manifest, seg.shard, seg.stop - seg.start)
        begin, end = index.span(seg.start, seg.stop)
        return end - begin

    def fetch(self, seg: SegmentLike) -> TarPayload:
        """One ranged read holding every member of samples [start, stop)."""
        check_segment(self.manifest, seg)
        if seg.stop <= seg.start:
            return TarPayload(0, b"", ())
        index = self.index(seg.shard)
        begin, end = index.span(seg.start, seg.stop)
        data = cached_read(
            self.store, self.cache, self.manifest.shard_paths[seg.shard], begin, end,
            checksum=self.manifest.shard_checksums[seg.shard], object_size=self.manifest.shard_num_bytes[seg.shard],
        )
        if self.verify_checksums:
            data = self.verified(seg, begin, data)
        return TarPayload(begin, data, index.samples[seg.start : seg.stop])

    def sample_sums_expected(self, shard: int) -> bool:
        """True when reads of the shard are checked against per-sample checksums (its sidecar)."""
        return self.verify_checksums and bool(self.manifest.sums_checksums) and bool(self.manifest.sums_checksums[shard])

    def sample_sums(self, shard: int) -> SampleSums | None:
        """The shard's per-sample checksums (its sidecar, checked against the manifest) and sample
        spans; None: it has none."""
        if not self.manifest.sums_checksums or not self.manifest.sums_checksums[shard]:
            return None
        # The index first: loading it fetches the sidecar alongside (object storage), which the
        # lookup below then finds; fetching the sidecar first fetched it twice (then again with the index).
        index = self.index(shard)
        return self._sums.get_or_load(shard, lambda: SampleSums.of_index(self._sums_of(shard), index))

    def _sums_of(self, shard: int) -> list[int]:
        """The shard's sidecar, fetched, checked against the manifest and parsed."""
        m, rel = self.manifest, sums_path(self.manifest.shard_paths[shard])
        url = self.store.url_of(rel)
        try:
            data = self.store.read(rel, expect_size=sums_bytes(m.shard_num_samples[shard]))  # short reads retried
        except StorageError as exc:
            if exc.not_found:
                raise ShardFormatError(f"{url}: the checksum sidecar the manifest names is missing; {FIX}") from None
            raise
        if checksum_bytes(data) != m.sums_checksums[shard]:
            raise ShardFormatError(f"{url}: checksum {checksum_bytes(data)} does not match the manifest's "
                                   f"{m.sums_checksums[shard]}: the sidecar is damaged or stale; {FIX}")
        return parse_sums(data, num_samples=m.shard_num_samples[shard], url=url)

    def verified(self, seg: SegmentLike, base: int, data: Any) -> Any:
        """`data` (shard bytes from offset `base` holding samples [start, stop)) if every sample matches
        its checksum; a cached copy that does not is dropped and read again from the store once.
        ShardFormatError naming the shard and the first bad sample's key otherwise."""
        sums = self.sample_sums(seg.shard)
        if sums is None:
            return data
        bad = sums.first_bad(data, base, seg.start, seg.stop)
        rel = self.manifest.shard_paths[seg.shard]
        if bad is not None and self.cache is not None:
            end = base + len(data)
            checksum = self.manifest.shard_checksums[seg.shard]
            if self.cache.discard(namespace=self.store.url, path=rel, start=base, end=end, checksum=checksum):
                data = cached_read(self.store, self.cache, rel, base, end, checksum=checksum)  # the store's copy
                bad = sums.first_bad(data, base, seg.start, seg.stop)
        if bad is None:
            return data
        raise ShardFormatError(
            f"{self.store.url_of(rel)}: sample {self.index(seg.shard).samples[seg.start + bad].key!r} (number "
            f"{seg.start + bad} of the shard) does "
            "not match its checksum: the shard's bytes changed after it was written (same size, so only the "
            f"checksum shows it); {FIX}"
        )

    def parse(self, seg: SegmentLike, payload: TarPayload) -> list[Sample]:
        """Samples as WebDataset dicts: __key__, __id__, __url__, then EXT -> bytes per member (projected)."""
        fields, base, data = self.fields, payload.base, payload.data
        first_id = int(self._offsets[seg.shard]) + seg.start
        url = self.store.url_of(self.manifest.shard_paths[seg.shard])  # one string shared by the samples
        out: list[Sample] = []
        for i, sample in enumerate(payload.samples):
            d: Sample = {"__key__": sample.key, "__id__": first_id + i, "__url__": url}
            for member in sample.members:
                if fields is None or member.ext in fields:
                    a = member.offset - base
                    d[member.ext] = data[a : a + member.size]
            out.append(d)
        return out


def zero_copy(payload: Any) -> Any:
    """A tar payload whose member slices are views of the fetched bytes instead of copies."""
    if isinstance(payload, TarPayload) and isinstance(payload.data, bytes):
        return TarPayload(payload.base, memoryview(payload.data), payload.samples)
    return payload
