"""Samples to a batch: decode (or substitute corrupt ones), labels, one-copy packing of raw fields.

Measured on a 2-core machine with ~100 KB JPEGs (benchmarks/results_loader.md): copies and page
faults, not Python, are what a RAW batch costs, so each byte is copied once from the fetched
payload into the batch's shared-memory tensor and nowhere else.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from dataio.batch import PackedBytes
from dataio.errors import CorruptSampleError
from dataio.rand import sample_seed

SKIPPED_KEY = "__skipped__"  # worker -> main only: URL#key of corrupt samples replaced; popped in main
BYTES_LIKE = (bytes, bytearray, memoryview)
_META_KEYS = ("__key__", "__id__", "__url__")  # keys of a sample dict that are bookkeeping, not fields
LABEL_FIELD = "cls"


class BatchContext(Protocol):
    """What assembling a batch needs from the worker's dataset: its job and decoder."""

    job: Any

    @property
    def decoder(self) -> Any: ...


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
    """An uninitialised uint8 tensor of n bytes, in shared memory inside a DataLoader worker."""
    if n > 0 and torch.utils.data.get_worker_info() is not None:
        try:
            return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))
        except (AttributeError, RuntimeError):  # private API (torch's collate uses it): fall back to a copy
            pass
    return torch.empty(n, dtype=torch.uint8)


def as_bytes(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with views turned into bytes, for user hooks that expect WebDataset's types."""
    if not any(isinstance(v, memoryview) for v in sample.values()):
        return sample
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def label_of(sample: dict[str, Any]) -> int:
    """The sample's integer label from its `cls` field (ASCII bytes or an int); -1 when absent."""
    value = sample.get(LABEL_FIELD)
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
            f"{url}: sample {key!r}: label field 'cls' is {bytes(value)[:20]!r}, not an integer; "
            "fix the source labels and rewrite the shard", url=url, key=str(key),
        ) from None


def default_collate(
    samples: Sequence[dict[str, Any]], *, images: torch.Tensor | None, image_field: str | None,
) -> dict[str, Any]:
    """Keys, labels, the decoded images (N, 3, H, W) or raw fields packed into one tensor each.

    Bookkeeping keys other than __key__ (__id__, __url__) stay in the worker: a batch carries no
    per-sample strings it does not need.
    """
    batch: dict[str, Any] = {
        "__key__": [str(s["__key__"]) for s in samples],
        "label": torch.tensor([label_of(s) for s in samples], dtype=torch.int64),
    }
    if images is not None:
        batch["image"] = images
    for name in [k for k in samples[0] if k not in _META_KEYS and k != LABEL_FIELD]:
        if images is not None and name == image_field:
            continue  # decoded: the bytes stay in the worker
        batch[name] = pack_field([s.get(name) for s in samples])
    return batch


def pack_field(values: list[Any]) -> Any:
    """Bytes -> PackedBytes (one tensor + offsets), numbers -> a tensor, anything else -> a list."""
    if all(isinstance(v, BYTES_LIKE) for v in values):
        return pack_bytes(values)
    if all(isinstance(v, str) for v in values):
        return pack_bytes([v.encode() for v in values])
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return torch.tensor(values, dtype=torch.bool)
    if all(isinstance(v, (int, np.integer)) for v in values):
        return torch.tensor([int(v) for v in values], dtype=torch.int64)
    if all(isinstance(v, (float, int, np.floating, np.integer)) for v in values):
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    return values


def assemble(
    owner: BatchContext, samples: list[dict[str, Any]], mask: list[bool], *, epoch: int,
    batch_number: int, read_s: float,
) -> dict[str, Any]:
    """One batch dict per the contract in dataio/batch.py (or the user's collate output)."""
    job = owner.job
    skipped: list[str] = []
    images = None
    start = time.perf_counter()
    if job.decode == "cpu":
        samples, mask, skipped, images = decode_images(owner, samples, mask, epoch=epoch)
    elif job.transform is not None:
        samples = [job.transform(as_bytes(s)) for s in samples]
    decode_s = time.perf_counter() - start if job.decode == "cpu" else 0.0
    if job.collate is not None:
        if images is not None:  # the hook sees each sample's decoded (3, H, W) image
            samples = [{**s, "image": images[i]} for i, s in enumerate(samples)]
        batch = job.collate([as_bytes(s) for s in samples])
    else:
        batch = default_collate(samples, images=images, image_field=job.image_field)
    if isinstance(batch, dict):
        if job.decode == "dali":  # DALI seeds each sample's crop like the CPU path: (seed, epoch, id)
            batch["__id__"] = torch.tensor([int(s["__id__"]) for s in samples], dtype=torch.int64)
            batch["epoch"] = epoch
        batch.setdefault("mask", torch.tensor(mask, dtype=torch.bool))
        batch.setdefault("read_s", read_s)
        batch.setdefault("decode_s", decode_s)
        batch.setdefault("batch_number", batch_number)
        if skipped:
            batch[SKIPPED_KEY] = skipped
    return batch


def decode_images(
    owner: BatchContext, samples: list[dict[str, Any]], mask: list[bool], *, epoch: int
) -> tuple[list[dict[str, Any]], list[bool], list[str], torch.Tensor]:
    """(samples, mask, skipped, images (N, 3, H, W)): corrupt samples raise or get a substitute."""
    job = owner.job
    seeds = [sample_seed(job.plan_config.seed, epoch, int(s["__id__"])) for s in samples]
    items = [s.get(job.image_field) for s in samples]
    if all(isinstance(x, BYTES_LIKE) for x in items):
        try:  # the common case: one call filling one preallocated batch tensor
            images = owner.decoder.decode_batch(
                items, seeds=seeds, keys=[str(s["__key__"]) for s in samples],
                url=url_of(samples[0]),
            )
            return samples, mask, [], images
        except CorruptSampleError:
            pass  # sample by sample below: the error names the sample's own shard
    decoded: list[np.ndarray | None] = []
    for sample, seed in zip(samples, seeds):
        try:
            decoded.append(decode_one(owner, sample, seed))
        except CorruptSampleError:
            if job.on_corrupt == "raise":
                raise
            decoded.append(None)
    samples, mask, skipped = substitute(owner, samples, decoded, mask)
    return samples, mask, skipped, torch.from_numpy(np.stack(decoded))  # type: ignore[arg-type]


def decode_one(owner: BatchContext, sample: dict[str, Any], seed: int) -> np.ndarray:
    """One sample's image as (3, H, W); CorruptSampleError names its shard URL and key."""
    key, field = str(sample.get("__key__", "?")), owner.job.image_field
    url = url_of(sample)
    data = sample.get(field) if field else None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptSampleError(
            f"{url}: sample {key!r} has no {field!r} bytes; pass decode=None to read raw fields, or "
            "fix the shard", url=url, key=key,
        )
    return owner.decoder.decode(bytes(data), seed=seed, key=key, url=url)


def substitute(
    owner: BatchContext, samples: list[dict[str, Any]], decoded: list[np.ndarray | None], mask: list[bool]
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
