"""Worker-side I/O helpers of the loader: read pieces, zero-copy parsing, one-copy batch packing.

Measured on a 2-core machine with ~100 KB JPEGs (benchmarks/results_loader.md): copies and page
faults, not Python, are what a RAW batch costs, so each byte is copied once from the fetched
payload into the batch's shared-memory tensor and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dataio.batch import PackedBytes
from dataio.errors import CorruptSampleError
from dataio.manifest import Manifest
from dataio.plan import Segment
from dataio.tar_reader import TarPayload

# Tar segments are fetched in pieces of about this many bytes: several ranged reads in flight
# hide object-storage latency, where one 64 MB GET per segment would serialise on one stream.
# Against SeaweedFS here 16 MB pieces beat 4 and 8 MB (s3fs costs CPU per request) and 32 MB.
READ_CHUNK_BYTES = 16 << 20
BYTES_LIKE = (bytes, bytearray, memoryview)
_META_KEYS = ("__key__", "__id__", "__url__")  # keys of a sample dict that are bookkeeping, not fields
LABEL_FIELD = "cls"


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


def zero_copy(payload: Any) -> Any:
    """A tar payload whose member slices are views of the fetched bytes instead of copies."""
    if isinstance(payload, TarPayload) and isinstance(payload.data, bytes):
        return TarPayload(payload.base, memoryview(payload.data), payload.samples)
    return payload


def as_bytes(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with views turned into bytes, for user hooks that expect WebDataset's types."""
    if not any(isinstance(v, memoryview) for v in sample.values()):
        return sample
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


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


_MALLOC_TUNED = False


def return_freed_buffers() -> None:
    """In a DataLoader worker, make glibc give multi-MB read buffers back to the system when freed.

    Every ranged read returns a fresh bytes object of several MB, allocated in the prefetch
    threads' arenas. glibc's adaptive threshold soon serves such sizes from those arenas, which
    then fragment and keep growing over an epoch (measured: one reader's RSS crept ~350 MB above
    its window + prefetch budget on a 40k-sample epoch). A fixed 1 MB mmap threshold keeps memory
    at the budget, for the price of page faults on each read.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED or torch.utils.data.get_worker_info() is None:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD, fixed (no adaptive raise)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator decides


def label_of(sample: dict[str, Any], url_of: Callable[[int], str]) -> int:
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
        url = url_of(int(sample["__id__"]))
        raise CorruptSampleError(
            f"{url}: sample {key!r}: label field 'cls' is {bytes(value)[:20]!r}, not an integer; "
            "fix the source labels and rewrite the shard", url=url, key=str(key),
        ) from None


def default_collate(
    samples: Sequence[dict[str, Any]], *, url_of: Callable[[int], str], images: torch.Tensor | None,
    image_field: str | None,
) -> dict[str, Any]:
    """Keys, labels, the decoded images (N, 3, H, W) or raw fields packed into one tensor each."""
    batch: dict[str, Any] = {
        "__key__": [str(s["__key__"]) for s in samples],
        "label": torch.tensor([label_of(s, url_of) for s in samples], dtype=torch.int64),
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
