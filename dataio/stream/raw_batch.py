"""A RAW batch from buffers by index arithmetic: the batch format of collate.default_collate, no dicts.

A batch's samples lie in one window buffer, or two where the batch straddles windows (the tail of
the old window is first compacted into a small reused buffer, CarryArena, so the old window's
buffer can be reused at once). Each `Part` says where every member of its samples lies in its
buffer; `build` turns parts into the batch dict: keys, labels parsed from the label field's bytes,
PackedBytes gathered with one copy per member into one output tensor (collate._new_uint8: shared
memory in a worker, a slab when buffers are reused), text/JSON/number fields parsed as the
general path does. A field that does not parse sends the batch through collate.assemble, which
raises or substitutes (on_corrupt) exactly as for any batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataio.batch import PackedBytes
from dataio.errors import CorruptSampleError
from dataio.stream.collate import (
    HEDGES_KEY,
    _new_uint8,
    assemble,
    hedges_since_last_batch,
    pack_bytes,
)
from dataio.stream.fields import (
    FieldError,
    batch_fields,
    collate_values,
    field_kinds,
    kind_of,
    label_field,
    parse_value,
)
from dataio.stream.job import OpenJob


@dataclass
class Part:
    """k samples of a batch, in delivery order, whose members lie in `buf`."""

    buf: np.ndarray  # uint8
    exts: tuple[str, ...]
    offsets: np.ndarray  # int64 [F, k] member data offsets in buf, -1 where absent
    sizes: np.ndarray  # int64 [F, k], -1 where absent
    ranks: np.ndarray  # int64 [F, k] member position in its sample (the sample dict's key order)
    keys: np.ndarray  # object [k]
    ids: np.ndarray  # int64 [k] global sample ids
    mask: np.ndarray  # bool [k] False for padding repeats
    shards: np.ndarray  # int64 [k]
    read_s: float
    # Read straight into the batch (raw_direct.py): these fields' members lie in their own arrays,
    # already packed as the batch's PackedBytes (offsets index field_bufs[ext], not buf).
    field_bufs: dict[str, np.ndarray] | None = None
    packed: dict[str, PackedBytes] | None = None

    def buf_of(self, ext: str) -> np.ndarray:
        return self.buf if self.field_bufs is None else self.field_bufs.get(ext, self.buf)


class CarryArena:
    """Where a stream compacts the parts of a batch that straddles windows: reused, so its pages
    fault once; `reset` at each batch (parts carried earlier keep the array they were copied to)."""

    def __init__(self) -> None:
        self.buf = np.empty(0, dtype=np.uint8)
        self.used = 0

    def reset(self) -> None:
        self.used = 0

    def carry(self, part: Part) -> Part:
        """The part with its members copied here, so the window holding them may be reused."""
        if part.buf is self.buf:
            return part  # carried at an earlier window change of this batch
        assert part.packed is None, "parts read straight into a batch are never carried"
        sizes = np.maximum(part.sizes, 0)
        at = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes.ravel(), out=at[1:])
        need = int(at[-1])
        if self.used + need > self.buf.nbytes:  # a larger array; carried parts keep the old one
            self.buf, self.used = np.empty(max(2 * self.buf.nbytes, need), dtype=np.uint8), 0
        at += self.used
        buf, dst, src = self.buf, memoryview(self.buf), memoryview(part.buf)
        for a, s, o in zip(part.offsets.ravel().tolist(), sizes.ravel().tolist(), at[:-1].tolist()):
            if s:
                dst[o: o + s] = src[a: a + s]  # keeps the GIL, as _Items.gather
        self.used = int(at[-1])
        offsets = np.where(part.sizes >= 0, at[:-1].reshape(part.sizes.shape), -1)
        return Part(buf=buf, exts=part.exts, offsets=offsets, sizes=part.sizes, ranks=part.ranks, keys=part.keys,
                    ids=part.ids, mask=part.mask, shards=part.shards, read_s=part.read_s)


class BatchBuilder:
    """Parts -> the batch dict of dataio/batch.py, as collate.assemble would build it from dicts."""

    def __init__(self, opened: OpenJob, *, epoch: int, url_of_shard: Callable[[int], str]) -> None:
        self.opened, self.epoch, self.url_of_shard = opened, epoch, url_of_shard
        self.manifest = opened.job.manifest
        self.kinds = field_kinds(self.manifest)
        self.label = label_field(self.manifest)

    def packs(self, name: str) -> bool:
        """Whether field `name` goes into the batch as PackedBytes (bytes and undecoded images)."""
        return name != self.label and (self.kinds.get(name) or kind_of(name, None)) in ("bytes", "image")

    def build(self, parts: Sequence[Part], number: int) -> dict[str, Any]:
        exts = tuple(dict.fromkeys(e for p in parts for e in p.exts))
        # Every part aligned on the union of fields: [F, B] arrays, and each sample's part.
        offsets, sizes, ranks = (np.concatenate([aligned_fields(p, getattr(p, name), exts) for p in parts], axis=1)
                                 for name in ("offsets", "sizes", "ranks"))
        owner_of = np.concatenate([np.full(len(p.ids), i, dtype=np.int64) for i, p in enumerate(parts)])
        ids, mask = np.concatenate([p.ids for p in parts]), np.concatenate([p.mask for p in parts])
        keys, shards = np.concatenate([p.keys for p in parts]), np.concatenate([p.shards for p in parts])
        read_s = sum(p.read_s for p in parts)
        present = sizes >= 0
        used = [f for f in range(len(exts)) if present[f].any()]
        first = {f: int(np.argmax(present[f])) for f in used}
        used.sort(key=lambda f: (first[f], int(ranks[f, first[f]])))  # a dict's key order over the batch
        items = _Items(parts, owner_of, keys, shards, self.url_of_shard)
        batch: dict[str, Any] = {"__key__": keys.tolist(),
                                 "label": self._labels(items, exts, offsets, sizes)}
        for f in used:
            name = exts[f]
            if name == self.label:
                continue
            kind = self.kinds.get(name) or kind_of(name, None)
            if kind in ("bytes", "image"):
                batch[name] = items.gather(name, offsets[f], sizes[f])
                continue
            try:
                values = [None if s < 0 else parse_value(kind, items.view(i, name, a, s), name)
                          for i, (a, s) in enumerate(zip(offsets[f].tolist(), sizes[f].tolist()))]
            except FieldError:  # raise or substitute, as the general path does
                return self._general(items, exts, offsets, sizes, ranks, ids, mask, number, read_s)
            batch[name] = collate_values(kind, values, pack_bytes)
        job = self.opened.job
        if not job.mixes:  # a field no sample of this batch holds is still a column (as in collate)
            for name in batch_fields(self.manifest, job.fields, job.image_fields, decoded=job.decode_at != "none"):
                if name not in batch:
                    kind = self.kinds.get(name) or kind_of(name, None)
                    batch[name] = collate_values(kind, [None] * len(ids), pack_bytes)
        # Each sample's source (a real mixture), and where it lies in that source, from its global id.
        source, shard, position = job.mixture.sources_of(ids)
        if job.mixes:
            batch["source"] = torch.from_numpy(source)
        batch["__shard__"], batch["__position__"] = torch.from_numpy(shard), torch.from_numpy(position)
        batch["mask"] = torch.from_numpy(mask.copy())
        batch["read_s"], batch["decode_s"], batch["batch_number"] = read_s, 0.0, number
        if job.captions is not None:  # image-text pairs: tokenized here too (raw bytes, or the GPU's to decode)
            batch.update(job.captions.of_batch(batch, ids.tolist(), epoch=self.epoch,
                                               urls=[items.url(i) for i in range(len(ids))]))
        batch[HEDGES_KEY] = hedges_since_last_batch()
        return batch

    def _labels(self, items: _Items, exts: tuple[str, ...], offsets: np.ndarray, sizes: np.ndarray) -> torch.Tensor:
        """collate.label_of for every sample: -1 where absent, CorruptSampleError where not an integer."""
        out = np.full(len(items.keys), -1, dtype=np.int64)
        if self.label not in exts:
            return torch.from_numpy(out)
        f = exts.index(self.label)
        for i, (a, s) in enumerate(zip(offsets[f].tolist(), sizes[f].tolist())):
            if s < 0:
                continue
            value = bytes(items.view(i, self.label, a, s))
            try:
                out[i] = int(value.strip())
            except ValueError:
                key, url = str(items.keys[i]), items.url(i)
                raise CorruptSampleError(
                    f"{url}: sample {key!r}: label field {self.label!r} is {value[:20]!r}, not an integer; "
                    "fix the source labels and rewrite the shard", url=url, key=key,
                ) from None
        return torch.from_numpy(out)

    def _general(self, items: _Items, exts: tuple[str, ...], offsets: np.ndarray, sizes: np.ndarray,
                 ranks: np.ndarray, ids: np.ndarray, mask: np.ndarray, number: int, read_s: float) -> dict[str, Any]:
        """The batch through collate.assemble, from sample dicts of views into the buffers."""
        samples = []
        for i, sample_id in enumerate(ids.tolist()):
            d: dict[str, Any] = {"__key__": items.keys[i], "__id__": sample_id, "__url__": items.url(i)}
            for f in sorted((f for f in range(len(exts)) if sizes[f, i] >= 0), key=lambda f: ranks[f, i]):
                d[exts[f]] = items.view(i, exts[f], int(offsets[f, i]), int(sizes[f, i]))
            samples.append(d)
        batch = assemble(self.opened, samples, mask.tolist(), epoch=self.epoch, batch_number=number, read_s=read_s)
        batch[HEDGES_KEY] = hedges_since_last_batch()
        return batch


@dataclass
class _Items:
    """The batch's samples: sample i's members lie in parts[owner_of[i]] (its buffer for that field)."""

    parts: Sequence[Part]
    owner_of: np.ndarray
    keys: np.ndarray
    shards: np.ndarray
    url_of_shard: Callable[[int], str]

    def view(self, i: int, ext: str, a: int, s: int) -> memoryview:
        return memoryview(self.parts[int(self.owner_of[i])].buf_of(ext)[a: a + s])

    def url(self, i: int) -> str:
        return self.url_of_shard(int(self.shards[i]))

    def gather(self, ext: str, offsets: np.ndarray, sizes: np.ndarray) -> PackedBytes:
        """PackedBytes of every sample's member (size -1: absent, an empty item), one copy each;
        none where the batch was read straight into them."""
        if len(self.parts) == 1 and self.parts[0].packed is not None and ext in self.parts[0].packed:
            return self.parts[0].packed[ext]
        sizes = np.maximum(sizes, 0)
        out_offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=out_offsets[1:])
        data = _new_uint8(int(out_offsets[-1]))
        # memoryview copies keep the GIL: numpy's would release it for every ~100 KB item, and with
        # other threads wanting it each copy would then wait for a switch interval to get it back.
        dst = memoryview(data.numpy())
        bufs, owners = [memoryview(p.buf_of(ext)) for p in self.parts], self.owner_of.tolist()
        for p, a, s, o in zip(owners, offsets.tolist(), sizes.tolist(), out_offsets[:-1].tolist()):
            if s:
                dst[o: o + s] = bufs[p][a: a + s]
        return PackedBytes(data, torch.from_numpy(out_offsets))


def aligned_fields(part: Any, values: np.ndarray, exts: tuple[str, ...]) -> np.ndarray:
    """values ([len(part.exts), k]) on the rows of `exts`, -1 for fields the part lacks (a Part, or
    raw_direct's rows: anything with `exts`)."""
    if part.exts == exts:
        return values
    out = np.full((len(exts), values.shape[1]), -1, dtype=np.int64)
    for f, ext in enumerate(part.exts):
        out[exts.index(ext)] = values[f]
    return out
