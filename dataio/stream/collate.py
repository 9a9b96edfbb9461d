"""Samples to a batch: decode (or substitute corrupt ones), labels, one-copy packing of raw fields.

Measured on a 2-core machine with ~100 KB JPEGs (benchmarks/results_loader.md): copies and page
faults, not Python, are what a RAW batch costs, so each byte is copied once from the fetched
payload into the batch's shared-memory tensor and nowhere else.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dataio.batch import PackedBytes
from dataio.decode.images import pick_image
from dataio.errors import CorruptSampleError
from dataio.rand import sample_seed
from dataio.storage.hedge import HedgeStats, process_stats
from dataio.stream.fields import (
    FieldError,
    batch_fields,
    collate_values,
    field_kinds,
    kind_of,
    label_field,
    parse_value,
)
from dataio.stream.image_slots import shared_slots
from dataio.stream.job import OpenJob
from dataio.stream.slabs import active_ring, fresh_uint8, recycled_uint8

SKIPPED_KEY = "__skipped__"  # worker -> main only: URL#key of corrupt samples replaced; popped in main
HEDGES_KEY = "__hedges__"  # worker -> main only: the worker's hedged-read counters since its last batch
BYTES_LIKE = (bytes, bytearray, memoryview)
_META_KEYS = ("__key__", "__id__", "__url__", "__source__")  # keys of a sample dict that are bookkeeping, not fields
LABEL_FIELD = "cls"


def url_of(sample: dict[str, Any]) -> str:
    """The redacted URL of the sample's shard, which the reader set as it parsed the sample."""
    return str(sample.get("__url__", "?"))


def pack_bytes(values: Sequence[bytes | bytearray | memoryview]) -> PackedBytes:
    """PackedBytes with one copy of each value, written where the batch will travel from.

    In a DataLoader worker the buffer is allocated in shared memory, as torch's own collate does,
    so sending the batch to the main process does not copy it again.
    """
    views = [memoryview(v).cast("B") for v in values]
    offsets = np.zeros(len(views) + 1, dtype=np.int64)
    np.cumsum([v.nbytes for v in views], out=offsets[1:])
    data = _new_uint8(int(offsets[-1]))
    out = memoryview(data.numpy())
    for view, a, b in zip(views, offsets[:-1].tolist(), offsets[1:].tolist()):
        out[a:b] = view
    return PackedBytes(data, torch.from_numpy(offsets))


def _new_uint8(n: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of n bytes, in shared memory inside a DataLoader worker; on a
    reused slab while a SlabRing serves the batch (reuse_buffers=True); else from the process's
    StoragePool, a storage the caller no longer holds (see slabs.py)."""
    ring = active_ring()
    if ring is not None and n > 0:
        return ring.allocate(n)
    if n > 0 and torch.utils.data.get_worker_info() is not None:
        try:
            return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))
        except (AttributeError, RuntimeError):  # private API (torch's collate uses it): fall back to a copy
            pass
        return torch.empty(n, dtype=torch.uint8)
    return recycled_uint8(n) if n > 0 else torch.empty(0, dtype=torch.uint8)


def as_bytes(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with views turned into bytes, for user hooks that expect WebDataset's types."""
    if not any(isinstance(v, memoryview) for v in sample.values()):
        return sample
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def label_of(sample: dict[str, Any], field: str = LABEL_FIELD) -> int:
    """The sample's integer label from its label field (ASCII bytes or an int); -1 when absent."""
    value = sample.get(field)
    if value is None:
        return -1
    if isinstance(value, (int, np.integer)):
        return int(value)
    try:
        return int(bytes(value).strip() if not isinstance(value, str) else value)
    except ValueError:
        key = sample.get("__key__", "?")
        url = url_of(sample)
        raise CorruptSampleError(
            f"{url}: sample {key!r}: label field {field!r} is {bytes(value)[:20]!r}, not an integer; "
            "fix the source labels and rewrite the shard", url=url, key=str(key),
        ) from None


def default_collate(
    samples: Sequence[dict[str, Any]], *, images: torch.Tensor | None,
    image_fields: tuple[str, ...] = (), kinds: dict[str, str] | None = None, label: str = LABEL_FIELD,
    expected: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Keys, labels, the decoded images (N, 3, H, W), and every other field as its kind's column
    (see dataio.stream.fields): a field some samples lack is None (empty bytes) for them.

    Bookkeeping keys other than __key__ (__id__, __url__) stay in the worker: a batch carries no
    per-sample strings it does not need."""
    kinds = kinds or {}
    batch: dict[str, Any] = {
        "__key__": [str(s["__key__"]) for s in samples],
        "label": torch.tensor([label_of(s, label) for s in samples], dtype=torch.int64),
    }
    if images is not None:
        batch["image"] = images
    # `expected` (fields.batch_fields): a field no sample of this batch holds is still a column
    names = dict.fromkeys([*(k for s in samples for k in s if k not in _META_KEYS and k != label), *expected])
    for name in names:
        if images is not None and name in image_fields:
            continue  # decoded: the bytes stay in the worker
        kind = kinds.get(name) or kind_of(name, None)
        batch[name] = collate_values(kind, [s.get(name) for s in samples], pack_bytes)
    return batch


def parse_fields(
    opened: OpenJob, samples: list[dict[str, Any]], kinds: dict[str, str], skip: set[int]
) -> list[dict[str, Any]]:
    """Samples with text, JSON and numbers parsed; a bad one raises, or joins `skip` (on_corrupt='skip')."""
    skip_names = {*_META_KEYS, *opened.job.image_fields, label_field(opened.job.manifest)}
    names = [n for n in dict.fromkeys(k for s in samples for k in s) if n not in skip_names]
    todo = [n for n in names if (kinds.get(n) or kind_of(n, None)) in ("text", "json", "number")]
    if not todo:
        return samples
    out = []
    for i, sample in enumerate(samples):
        parsed = dict(sample)
        for name in todo:
            value = sample.get(name)
            if value is None:
                continue
            try:
                parsed[name] = parse_value(kinds.get(name) or kind_of(name, None), value, name)
            except FieldError as exc:
                key, url = str(sample.get("__key__", "?")), url_of(sample)
                if opened.job.on_corrupt == "raise":
                    raise CorruptSampleError(
                        f"{url}: sample {key!r}: {exc}; fix the source and rewrite the shard, or pass "
                        "on_corrupt='skip'", url=url, key=key,
                    ) from None
                skip.add(i)
        out.append(parsed)
    return out


def assemble(
    opened: OpenJob, samples: list[dict[str, Any]], mask: list[bool], *, epoch: int,
    batch_number: int, read_s: float,
) -> dict[str, Any]:
    """One batch dict per the contract in dataio/batch.py (or the user's collate output)."""
    job = opened.job
    skipped: list[str] = []
    images = None
    start = time.perf_counter()
    kinds = field_kinds(job.manifest)
    label = label_field(job.manifest)
    bad: set[int] = set()
    in_worker = job.decode_at == "worker" and not opened.ship_raw  # decode="auto": a ticket may say raw
    if not in_worker and job.transform is not None:  # the hook sees the raw sample (bytes)
        samples = [job.transform(as_bytes(s)) for s in samples]
    if job.collate is None:
        samples = parse_fields(opened, samples, kinds, bad)
        if bad and not in_worker:
            samples, mask, skipped = substitute(opened, samples, [None if i in bad else True for i in range(len(samples))], mask)
    if in_worker:
        samples, mask, skipped, images = decode_images(opened, samples, mask, epoch=epoch, bad=bad)
    decode_s = time.perf_counter() - start if in_worker else 0.0
    if job.collate is not None:
        if images is not None:  # the hook sees each sample's decoded (3, H, W) image
            samples = [{**s, "image": images[i]} for i, s in enumerate(samples)]
        batch = job.collate([as_bytes(s) for s in samples])
    else:
        expected = () if job.mixes else batch_fields(job.manifest, job.fields, job.image_fields,
                                                      decoded=in_worker or job.decode_at == "main")
        batch = default_collate(samples, images=images, image_fields=job.image_fields,
                                kinds=kinds, label=label, expected=expected)
    if isinstance(batch, dict):
        ids = [int(s["__id__"]) for s in samples]
        # Each sample's source (a real mixture), shard and position in it, from its id.
        source, source_shard, position = job.mixture.sources_of(ids)
        if job.mixes:
            batch.setdefault("source", torch.from_numpy(source))
        if job.decode_at == "main":  # DALI (and the GPU) seed each sample's crop like the CPU path: (seed, epoch, id)
            batch["__id__"] = torch.tensor(ids, dtype=torch.int64)
            batch["epoch"] = epoch
        if job.collate is None:
            batch["__shard__"], batch["__position__"] = torch.from_numpy(source_shard), torch.from_numpy(position)
        batch.setdefault("mask", torch.tensor(mask, dtype=torch.bool))
        batch.setdefault("read_s", read_s)
        batch.setdefault("decode_s", decode_s)
        batch.setdefault("batch_number", batch_number)
        if job.captions is not None:  # image-text pairs: captions tokenized here, in the worker (captions.py)
            batch.update(job.captions(samples, epoch=epoch))
        if skipped:
            batch[SKIPPED_KEY] = skipped
    return batch


def decode_images(
    opened: OpenJob, samples: list[dict[str, Any]], mask: list[bool], *, epoch: int, bad: set[int] | None = None,
) -> tuple[list[dict[str, Any]], list[bool], list[str], torch.Tensor]:
    """(samples, mask, skipped, images (N, 3, H, W)): each sample's own image field; corrupt samples
    (and those in `bad`) raise or get a substitute."""
    job = opened.job
    bad = bad or set()
    seeds = [sample_seed(job.plan_config.seed, epoch, int(s["__id__"])) for s in samples]
    picked = [pick_image(s, job.image_fields) for s in samples]
    if not bad and all(p is not None for p in picked):
        try:  # the common case: one call filling one preallocated batch tensor
            images = opened.decoder.decode_batch(
                [p[1] for p in picked], seeds=seeds, keys=[str(s["__key__"]) for s in samples],  # type: ignore[index]
                url=url_of(samples[0]), out=_images_out(opened, len(samples)),
            )
            return samples, mask, [], images
        except CorruptSampleError:
            pass  # sample by sample below: the error names the sample's own shard
    decoded: list[np.ndarray | None] = []
    for i, (sample, seed) in enumerate(zip(samples, seeds)):
        if i in bad:
            decoded.append(None)
            continue
        try:
            decoded.append(decode_one(opened, sample, seed))
        except CorruptSampleError:
            if job.on_corrupt == "raise":
                raise
            decoded.append(None)
    samples, mask, skipped = substitute(opened, samples, decoded, mask)
    return samples, mask, skipped, torch.from_numpy(np.stack(decoded))  # type: ignore[arg-type]


def _images_out(opened: OpenJob, n: int) -> torch.Tensor | None:
    """The (n, 3, size, size) batch tensor the decoder fills in place; fresh pages cost ~85 us of
    page faults per 224x224 image (a 38.5 MB batch of 256), reused ones a few us. With
    reuse_buffers=True it is on the serving SlabRing (shared memory in a worker; valid until the
    caller asks for the next batch). Else, in a DataLoader worker, shared memory, where the batch
    travels from (decoded there, it is not built in the heap and copied as it is sent), reused once
    nothing in the main process refers to it (image_slots.py); in the caller's process (reader
    threads, num_workers=0, the first batch) from the StoragePool."""
    if n == 0:
        return None
    decoder = opened.decoder
    size = decoder.config.size
    dtype = torch.from_numpy(np.empty(0, dtype=decoder.dtype)).dtype
    num_bytes = n * 3 * size * size * dtype.itemsize
    ring = active_ring()
    if ring is not None:
        return ring.allocate(num_bytes).view(dtype).view(n, 3, size, size)
    if torch.utils.data.get_worker_info() is None:
        return recycled_uint8(num_bytes).view(dtype).view(n, 3, size, size)
    try:
        if opened.job.pooled_images:  # reused once the main process let go (image_slots.py)
            out = shared_slots().allocate(num_bytes)
        else:
            out = fresh_uint8(num_bytes, shared=True)
    except (AttributeError, RuntimeError):  # private API (torch's collate uses it): the decoder allocates
        return None
    return out.view(dtype).view(n, 3, size, size)


def decode_one(opened: OpenJob, sample: dict[str, Any], seed: int) -> np.ndarray:
    """One sample's image as (3, H, W); CorruptSampleError names its shard URL and key."""
    key, fields = str(sample.get("__key__", "?")), opened.job.image_fields
    url = url_of(sample)
    picked = pick_image(sample, fields)
    if picked is None:
        raise CorruptSampleError(
            f"{url}: sample {key!r} has no image (none of the image fields {list(fields)} holds bytes; "
            f"it has {[k for k in sample if not k.startswith('__')]}); pass decode=None to read raw fields, "
            "on_corrupt='skip' to leave such samples out, or fix the shard", url=url, key=key,
        )
    return opened.decoder.decode(bytes(picked[1]), seed=seed, key=key, url=url)


def substitute(
    opened: OpenJob, samples: list[dict[str, Any]], decoded: list[Any], mask: list[bool]
) -> tuple[list[dict[str, Any]], list[bool], list[str]]:
    """Replace each corrupt sample (None in `decoded`, in place) by the next good one of the batch, masked out."""
    good = [i for i, image in enumerate(decoded) if image is not None]
    bad = [i for i, image in enumerate(decoded) if image is None]
    if not bad:
        return samples, mask, []
    if not good:
        first = samples[bad[0]]
        url = url_of(first)
        raise CorruptSampleError(
            f"{url}: every sample of a batch is corrupt (first {first.get('__key__')!r}); nothing to "
            "substitute with on_corrupt='skip': check the dataset", url=url, key=str(first.get("__key__")),
        )
    samples, mask, skipped = list(samples), list(mask), []
    for i in bad:
        skipped.append(f"{url_of(samples[i])}#{samples[i].get('__key__')}")
        j = good[bisect.bisect_right(good, i) % len(good)]  # deterministic: the next good one, cyclically
        decoded[i], samples[i], mask[i] = decoded[j], samples[j], False
    return samples, mask, skipped


_LAST_HEDGES: tuple[int, HedgeStats] = (os.getpid(), HedgeStats())
_HEDGES_LOCK = threading.Lock()


def hedges_since_last_batch() -> dict[str, int]:
    """This process's hedged-read counters since the previous call (what its last batch did not report)."""
    global _LAST_HEDGES
    with _HEDGES_LOCK:  # reader threads of one process report in turn
        pid, last = _LAST_HEDGES
        if pid != os.getpid():  # a forked worker: its counters start at zero (hedge.process_stats)
            last = HedgeStats()
        now = process_stats()
        _LAST_HEDGES = (os.getpid(), now)
    return {k: v - getattr(last, k) for k, v in now.as_dict().items()}


