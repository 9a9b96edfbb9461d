"""Reading token ranges of a token dataset's shards (dataio/format/token_layout.py), checked block by block.

Local shards are memory-mapped: a range is a view of the map, its checksum blocks hashed once per
process the first time they are read (one pass over pages the copy into the batch touches anyway).
From object storage a window's reads (contiguous token ranges, merged by the plan) go through the
Store as one ranged read each, of the whole checksum blocks around them, so the Store's retries,
short-read checks and hedging apply, and the Prefetcher runs them ahead of use within a byte budget.
With cache_dir, those ranged reads go through the disk cache (storage/cache.py). Each shard's
document offsets and block checksums (small sidecars) are read once and kept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from dataio.errors import ShardFormatError
from dataio.format.manifest import Manifest
from dataio.format.token_layout import (
    OFFSET_DTYPE,
    SUM_DTYPE,
    block_range,
    check_blocks,
    check_offsets,
    memmap_tokens,
    offsets_path,
    read_array,
    read_token_range,
    token_sums_path,
)
from dataio.plan.types import Segment
from dataio.readers.base import cached_read
from dataio.storage.cache import DiskCache
from dataio.storage.prefetch import Prefetcher
from dataio.storage.store import Store


@dataclass(frozen=True, slots=True)
class Piece:
    """Tokens [start, stop) of manifest shard `shard`, in memory (a view of a map or of a read)."""

    shard: int
    start: int
    stop: int
    tokens: np.ndarray  # (stop - start,) uint16 / uint32


class TokenShards:
    """A token dataset's shards as token ranges: `read(segment)` -> Piece; sidecars cached, thread-safe."""

    def __init__(self, store: Store, manifest: Manifest, *, verify_checksums: bool = True,
                 cache: DiskCache | None = None) -> None:
        if manifest.tokens is None:
            raise ValueError(f"{store.url}: not a token dataset (format {manifest.format!r})")
        self.store, self.manifest, self.info = store, manifest, manifest.tokens
        self.verify, self.cache = verify_checksums, cache
        self._lock = threading.Lock()
        self._offsets: dict[int, np.ndarray] = {}
        self._sums: dict[int, np.ndarray] = {}
        self._maps: dict[int, np.ndarray] = {}
        self._checked: dict[int, np.ndarray] = {}  # local shards: (num_blocks,) bool, blocks already hashed
        self._all_checked: set[int] = set()  # local shards whose every block is hashed
        # Global document number of each shard's first document (manifest order).
        self.doc_base = np.concatenate([[0], np.cumsum(np.asarray(manifest.shard_num_samples, dtype=np.int64))])

    def __getstate__(self) -> dict[str, Any]:
        # A lock and memory maps do not pickle; a worker process maps and checks its own (spawn start method).
        return {"store": self.store, "manifest": self.manifest, "verify": self.verify, "cache": self.cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"], state["manifest"], verify_checksums=state["verify"],  # type: ignore[misc]
                      cache=state["cache"])

    def url_of(self, shard: int) -> str:
        return self.store.url_of(self.manifest.shard_paths[shard])

    def offsets(self, shard: int) -> np.ndarray:
        """(num_documents + 1,) int64 document offsets of the shard, checked against the manifest."""
        got = self._offsets.get(shard)
        if got is None:
            rel = self.manifest.shard_paths[shard]
            got = read_array(self.store, offsets_path(rel), OFFSET_DTYPE)
            check_offsets(got, self.manifest.shard_num_tokens[shard], self.manifest.shard_num_samples[shard],
                          url=self.url_of(shard))
            with self._lock:
                self._offsets[shard] = got
        return got

    def document_lengths(self, shards: Iterable[int]) -> list[np.ndarray]:
        """Tokens per document of each shard (reads every shard's offsets: aligned packing needs them)."""
        return [np.diff(self.offsets(s)) for s in shards]

    def plan_lengths(self, packing: str) -> tuple[np.ndarray, ...]:
        """What the token plan cuts, per shard: concat needs only each shard's tokens, aligned every
        document's length."""
        if packing == "aligned":
            return tuple(self.document_lengths(range(self.manifest.num_shards)))
        return tuple(np.asarray([n] if n else [], dtype=np.int64) for n in self.manifest.shard_num_tokens)

    def sums(self, shard: int) -> np.ndarray:
        got = self._sums.get(shard)
        if got is None:
            rel, n = self.manifest.shard_paths[shard], self.manifest.shard_num_tokens[shard]
            got = read_array(self.store, token_sums_path(rel), SUM_DTYPE)
            if len(got) != -(-n // self.info.block_tokens):
                raise ShardFormatError(f"{self.url_of(shard)}: its checksum sidecar lists {len(got)} blocks, the "
                                       f"shard has {-(-n // self.info.block_tokens)}; rewrite the dataset")
            with self._lock:
                self._sums[shard] = got
        return got

    def read(self, seg: Segment, *, check: bool = True) -> Piece:
        """The tokens of `seg` (token offsets in its shard), checked against the block checksums (local
        shards with check=False: a view of the map, its blocks checked as they are used, check_ranges)."""
        if self.store.is_local:
            return Piece(seg.shard, seg.start, seg.stop, self._local(seg, check=check))
        rel, n = self.manifest.shard_paths[seg.shard], self.manifest.shard_num_tokens[seg.shard]
        sums = self.sums(seg.shard) if self.verify else None
        if sums is None:
            size = self.info.np_dtype.itemsize
            data = self.store.read(rel, seg.start * size, seg.stop * size)
            return Piece(seg.shard, seg.start, seg.stop, np.frombuffer(data, dtype=self.info.np_dtype))
        ranges = _CachedRanges(self, seg.shard)
        try:
            tokens = read_token_range(ranges, rel, seg.start, seg.stop, self.info, num_tokens=n, sums=sums,
                                      offsets=self.offsets(seg.shard))
        except ShardFormatError:
            ranges.discard()  # a cached copy that fails its checksums is dropped, the error stands
            raise
        return Piece(seg.shard, seg.start, seg.stop, tokens)

    def _local(self, seg: Segment, *, check: bool = True) -> np.ndarray:
        mm = self._maps.get(seg.shard)
        if mm is None:
            rel = self.manifest.shard_paths[seg.shard]
            # A plain ndarray over the map: slicing a np.memmap costs its subclass hooks per slice (~4 us a row).
            mm = memmap_tokens(self.store.path(rel), self.info).view(np.ndarray)
            if len(mm) != self.manifest.shard_num_tokens[seg.shard]:
                raise ShardFormatError(f"{self.url_of(seg.shard)}: {len(mm)} tokens, its manifest says "
                                       f"{self.manifest.shard_num_tokens[seg.shard]}; rewrite the dataset")
            with self._lock:
                self._maps[seg.shard] = mm
        if self.verify and check:
            first, end, _, _ = block_range(seg.start, seg.stop, self.info.block_tokens, len(mm))
            self._check_blocks(seg.shard, mm, np.arange(first, end))
        return mm[seg.start:seg.stop]

    def check_ranges(self, shard: int, lo: np.ndarray, hi: np.ndarray) -> None:
        """Check the blocks holding tokens [lo[i], hi[i]) of a local shard read with check=False (each block
        once per process): a batch checks what it copies, so a first batch hashes its rows, not its window."""
        if not (self.verify and self.store.is_local) or not len(lo) or shard in self._all_checked:
            return
        bt = self.info.block_tokens
        first, last = lo // bt, (np.maximum(hi, lo + 1) - 1) // bt  # (k,) each range's first and last block
        if bool((last - first > 1).any()):  # a range over three blocks or more (a seq_len above a block)
            blocks = np.concatenate([np.arange(f, g + 1) for f, g in zip(first.tolist(), last.tolist())])
        else:
            blocks = np.concatenate([first, last])
        blocks.sort()  # unique, without np.unique (its first call imports numpy.ma: ~15 ms of a first batch)
        self._check_blocks(shard, self._maps[shard], blocks[np.append(True, blocks[1:] != blocks[:-1])])

    def _check_blocks(self, shard: int, mm: np.ndarray, blocks: np.ndarray) -> None:
        """Hash those of `blocks` not hashed yet in this process (each block once)."""
        sums = self.sums(shard)
        checked = self._checked.get(shard)
        if checked is None:
            checked = self._checked.setdefault(shard, np.zeros(len(sums), dtype=bool))
        bt = self.info.block_tokens
        for block in blocks[~checked[blocks]].tolist():
            data = memoryview(mm[block * bt:(block + 1) * bt]).cast("B")
            if xxhash.xxh3_64_intdigest(data) != int(sums[block]):
                check_blocks(data, sums, int(block), self.info, url=self.url_of(shard), offsets=self.offsets(shard))
            checked[block] = True
        if checked.all():
            self._all_checked.add(shard)  # every later batch of this shard: no check left to make


class _CachedRanges:
    """The Store's ranged reads of one shard through the disk cache (when there is one), for read_token_range;
    the manifest's whole-shard checksum names the cache entries, so a rewritten shard never hits."""

    def __init__(self, shards: TokenShards, shard: int) -> None:
        self.shards, self.shard = shards, shard
        self.last: tuple[int, int] | None = None
        self.url_of = shards.store.url_of

    def read(self, rel: str, start: int, end: int) -> bytes:
        m = self.shards.manifest
        self.last = (start, end)
        return cached_read(self.shards.store, self.shards.cache, rel, start, end,
                           checksum=m.shard_checksums[self.shard], object_size=m.shard_num_bytes[self.shard])

    def discard(self) -> None:
        if self.shards.cache is not None and self.last is not None:
            m = self.shards.manifest
            self.shards.cache.discard(namespace=self.shards.store.url, path=m.shard_paths[self.shard],
                                      start=self.last[0], end=self.last[1], checksum=m.shard_checksums[self.shard])


class TokenSources:
    """One or several token datasets (a mixture; one dataset is a mixture of one) as global shard numbers:
    source s's shard j is shard_base[s] + j. `read` and `windows` take Segments of global shards."""

    def __init__(self, shards: Sequence[TokenShards]) -> None:
        self.shards = tuple(shards)
        counts = [s.manifest.num_shards for s in self.shards]
        self.shard_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.itemsize = max(s.info.np_dtype.itemsize for s in self.shards)
        self.is_local = all(s.store.is_local for s in self.shards)
        self._located: dict[int, tuple[TokenShards, int]] = {}

    def locate(self, shard: int) -> tuple[TokenShards, int]:
        """(the source's TokenShards, its own shard number) of a global shard."""
        got = self._located.get(shard)
        if got is None:
            source = int(self.shard_base.searchsorted(shard, side="right") - 1)
            got = self._located[shard] = (self.shards[source], shard - int(self.shard_base[source]))
        return got

    def read(self, seg: Segment, *, check: bool = True) -> Piece:
        src, local = self.locate(seg.shard)
        piece = src.read(Segment(shard=local, start=seg.start, stop=seg.stop), check=check)
        return Piece(seg.shard, seg.start, seg.stop, piece.tokens)

    def check_ranges(self, shard: int, lo: np.ndarray, hi: np.ndarray) -> None:
        """TokenShards.check_ranges for a global shard: tokens [lo[i], hi[i]) of it, local offsets."""
        src, local = self.locate(shard)
        src.check_ranges(local, lo, hi)

    def doc_runs(self, shard: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(start relative to lo, document number in its dataset) of each document run in tokens [lo, hi)."""
        src, local = self.locate(shard)
        offsets = src.offsets(local)
        # ndarray methods, not np.searchsorted: this runs per row, where the wrapper's cost shows
        d0 = int(offsets.searchsorted(lo, side="right")) - 1
        d1 = int(offsets.searchsorted(hi, side="left"))  # the documents starting before hi: d0 .. d1 - 1
        starts = offsets[d0:d1] - lo
        starts[0] = 0
        return starts, np.arange(d0, d1, dtype=np.int64) + int(src.doc_base[local])

    def doc_runs_many(self, shard: int, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """doc_runs of several token ranges [lo[i], hi[i]) of one shard at once: per run, its range i, its
        start relative to lo[i] and its document number in its dataset (a batch's rows in a few array ops)."""
        src, local = self.locate(shard)
        offsets = src.offsets(local)
        d0 = offsets.searchsorted(lo, side="right") - 1  # (k,) each range's first document
        counts = offsets.searchsorted(hi, side="left") - d0  # (k,) documents starting before hi, >= 1
        first = np.cumsum(counts) - counts  # (k,) where each range's runs begin among all runs
        ranges = np.repeat(np.arange(len(lo), dtype=np.int64), counts)  # (runs,)
        docs = np.arange(len(ranges), dtype=np.int64) - first[ranges] + d0[ranges]
        starts = offsets[docs] - lo[ranges]
        starts[first] = 0  # a range starts a run of its first document, wherever that document began
        return ranges, starts, docs + int(src.doc_base[local])

    def windows(self, segments: Iterable[tuple[Segment, ...]], *, budget_bytes: int,
                max_in_flight: int) -> Iterator[list[Piece]]:
        """The pieces of each window's segments, in order; object storage read ahead (Prefetcher) and
        checked as read; local shards mapped, their blocks checked by whoever uses them (check_ranges)."""
        if self.is_local:
            for segs in segments:
                yield [self.read(s, check=False) for s in segs]
            return
        size = self.itemsize
        flat = ((k, s) for k, segs in enumerate(_announce(segments)) for s in segs)
        fetcher = Prefetcher(lambda item: self.read(item[1]) if item[1] is not None else None,
                             size_of=lambda item: 0 if item[1] is None else (item[1].stop - item[1].start) * size,
                             budget_bytes=budget_bytes, max_in_flight=max_in_flight)
        pieces: list[Piece] = []
        for (_, seg), piece, _ in fetcher.run(flat):
            if seg is None:  # the end of a window
                yield pieces
                pieces = []
            else:
                pieces.append(piece)


def _announce(segments: Iterable[tuple[Segment, ...]]) -> Iterator[tuple[Segment | None, ...]]:
    """Each window's segments followed by a None marking its end (so empty windows come through too)."""
    for segs in segments:
        yield (*segs, None)
