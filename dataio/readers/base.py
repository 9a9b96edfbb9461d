"""The common shape of shard readers: a segment (samples [start, stop) of one shard) in, samples out.

A reader splits the work in two so a prefetcher can overlap them: `fetch` does the I/O only
(one ranged read per segment, run in background threads), `parse` does the CPU part (slicing
samples out of the payload). Samples are dicts keyed like WebDataset's (`__key__`, `__url__`:
the redacted URL of the sample's shard, set as it is parsed), plus `__id__`, the sample's global
number (the shard's offset in manifest order + its index in the shard).
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from dataio.errors import ShardFormatError
from dataio.format.manifest import Manifest, max_samples_in
from dataio.plan.types import Segment
from dataio.storage.store import Store

if TYPE_CHECKING:
    from dataio.storage.cache import DiskCache

# Tar segments are fetched in pieces of about this many bytes: several ranged reads in flight
# hide object-storage latency, where one 64 MB GET per segment would serialise on one stream.
# Against SeaweedFS here 16 MB pieces beat 4 and 8 MB (s3fs costs CPU per request) and 32 MB.
READ_CHUNK_BYTES = 16 << 20
Sample = dict[str, Any]
V = TypeVar("V")


class SegmentLike(Protocol):
    """Anything naming samples [start, stop) of manifest shard number `shard` (e.g. plan.Segment)."""

    @property
    def shard(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def stop(self) -> int: ...


class SegmentReader(Protocol):
    """Reads segments of one dataset; safe to call fetch from several threads at once."""

    def payload_bytes(self, seg: SegmentLike) -> int:
        """Bytes the segment's payload will take in memory (an estimate until its index is known)."""
        ...

    def fetch(self, seg: SegmentLike) -> Any:
        """I/O only: the raw payload of the segment, retried and checked for short reads."""
        ...

    def parse(self, seg: SegmentLike, payload: Any) -> list[Sample]:
        """CPU only: the samples [start, stop) of the shard, in shard order."""
        ...


def check_fields(manifest: Manifest, fields: Sequence[str] | None) -> tuple[str, ...] | None:
    """Validate a field projection against the manifest; None means every field."""
    if fields is None:
        return None
    if isinstance(fields, str):
        raise TypeError(f"fields must be a sequence of names, not the string {fields!r}")
    wanted = tuple(dict.fromkeys(f for f in fields if f not in ("__key__", "__id__")))
    known = manifest.field_names
    unknown = [f for f in wanted if known and f not in known]
    if unknown:
        raise ValueError(f"fields {unknown} are not in this dataset; it has {list(known)}")
    return wanted


def check_segment(manifest: Manifest, seg: SegmentLike) -> None:
    """ValueError unless the segment lies inside its shard."""
    if not 0 <= seg.shard < manifest.num_shards:
        raise ValueError(f"segment {seg!r}: shard {seg.shard} is outside 0..{manifest.num_shards - 1}")
    n = manifest.shard_num_samples[seg.shard]
    if not 0 <= seg.start <= seg.stop <= n:
        raise ValueError(f"segment {seg!r}: range [{seg.start}, {seg.stop}) is outside shard of {n} samples")


def shard_offsets(manifest: Manifest) -> np.ndarray:
    """(S+1,) int64: global id of each shard's first sample, prefix sums of the sizes in manifest order."""
    sizes = np.asarray(manifest.shard_num_samples, dtype=np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def sample_url_of(store: Store, manifest: Manifest) -> Callable[[int], str]:
    """global sample id -> redacted URL of its shard, for code that holds ids but no longer the
    samples (DALI decoding in the main process); samples themselves carry `__url__`."""
    offsets = shard_offsets(manifest)

    def url_of(sample_id: int) -> str:
        shard = bisect.bisect_right(offsets, int(sample_id)) - 1  # empty shards share an offset: the last wins
        return store.url_of(manifest.shard_paths[shard])

    return url_of


def proportional_bytes(manifest: Manifest, shard: int, num_samples: int) -> int:
    """The shard's bytes scaled to `num_samples` of its samples: a fair estimate without I/O."""
    total = manifest.shard_num_samples[shard]
    if total == 0 or num_samples <= 0:
        return 0
    return -(-manifest.shard_num_bytes[shard] * num_samples // total)


# A cache of per-shard metadata (tar indexes, checksums, RAW columns, Parquet footers) holds at most
# this much: shards with many small samples keep fewer entries, so memory does not grow with the
# samples per shard.
METADATA_CACHE_BYTES = 32 * 2**20


def nbytes_of(value: Any) -> int:
    """An entry's size for an LruCache's byte bound: its `nbytes` (indexes, columns, checksums)."""
    return int(value.nbytes)


class LruCache:
    """A small thread-safe LRU map for per-shard metadata (indexes, Parquet footers), bounded in
    entries and, with `size_of`, in bytes: `max_bytes` holds however many samples a shard has (the
    entry bound alone would let 64 indexes of million-sample shards take gigabytes). The entry
    used last is always kept, even alone over the budget."""

    def __init__(self, capacity: int, *, max_bytes: int | None = None,
                 size_of: Callable[[Any], int] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity, self.max_bytes, self.size_of = capacity, max_bytes, size_of
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._sizes: dict[Any, int] = {}
        self.num_bytes = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A lock does not pickle, and each process (worker) loads its own metadata anyway.
        return {"capacity": self.capacity, "max_bytes": self.max_bytes, "size_of": self.size_of}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"], max_bytes=state.get("max_bytes"), size_of=state.get("size_of"))  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def get_or_load(self, key: Any, load: Callable[[], V]) -> V:
        """The cached value, or `load()` stored; two threads may both load once (harmless)."""
        value = self.get(key)
        if value is None:
            value = load()
            size = self.size_of(value) if self.size_of is not None else 0
            with self._lock:
                self.num_bytes += size - self._sizes.get(key, 0)
                self._items[key], self._sizes[key] = value, size
                self._items.move_to_end(key)
                while len(self._items) > self.capacity or (
                        self.max_bytes is not None and self.num_bytes > self.max_bytes and len(self._items) > 1):
                    old, _ = self._items.popitem(last=False)
                    self.num_bytes -= self._sizes.pop(old)
        return value


def check_shard_size(store: Store, manifest: Manifest, shard: int, *, on_read: bool = False) -> None:
    """ShardFormatError unless the shard's real size is the manifest's and can hold its sample
    count (done once, when first opened: a parted manifest's per-shard bytes are first seen here).
    on_read: the caller's reads pass object_size (cached_read), so where the store states an
    object's size with every ranged read (S3) those reads check it and no HEAD is sent here."""
    rel, want = manifest.shard_paths[shard], manifest.shard_num_bytes[shard]
    n = manifest.shard_num_samples[shard]
    if n > max_samples_in(manifest.format, want):
        raise ShardFormatError(f"{store.url_of(rel)}: the manifest claims {n} samples in {want} bytes, more "
                               "than fit: the manifest is forged or corrupt; rewrite the dataset")
    if on_read and store.sizes_on_read:
        return
    got = store.size(rel)
    if got != want:
        raise ShardFormatError(
            f"{store.url_of(rel)}: shard is {got} bytes but the manifest says {want}; the shard or the "
            "manifest was replaced or damaged: rewrite the dataset with `shardify write`"
        )


def cached_read(
    store: Store,
    cache: DiskCache | None,
    rel: str,
    start: int,
    end: int,
    *,
    checksum: str,
    object_size: int | None = None,
) -> bytes:
    """Bytes [start, end) of `rel`, through the disk cache when there is one; short reads fail.
    object_size: the object's size by the manifest, checked where the store states it (Store.read)."""
    if end <= start:
        return b""

    def read() -> bytes:
        if object_size is None:
            return store.read(rel, start, end)
        return store.read(rel, start, end, object_size=object_size)

    if cache is None:
        return read()
    return cache.get_or_fetch(
        namespace=store.url, path=rel, start=start, end=end, checksum=checksum, fetch=read
    )


def split_segment(seg: Segment, manifest: Manifest, chunk_bytes: int = READ_CHUNK_BYTES) -> list[Segment]:
    """A tar segment as consecutive pieces of about `chunk_bytes` (sized from the shard's mean sample)."""
    n = seg.stop - seg.start
    if manifest.format != "tar" or n <= 1:
        return [seg]
    per_sample = manifest.shard_num_bytes[seg.shard] / max(1, manifest.shard_num_samples[seg.shard])
    step = max(1, int(chunk_bytes // max(1.0, per_sample)))
    if step >= n:
        return [seg]
    return [Segment(shard=seg.shard, start=a, stop=min(seg.stop, a + step)) for a in range(seg.start, seg.stop, step)]


class SizedRawFile(io.RawIOBase):
    """The seekable, read-only half of a file of `_size` bytes at position `_pos`; subclasses
    say where the bytes come from (readinto). pyarrow reads Parquet footers and pages through it."""

    _size: int
    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos
