"""Helpers for tests that run the loader: the shared small dataset's shape, one epoch, the first
k batches, the real keys of batches, and a batch summary for the resume harness."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fsspec
import torch

from dataio import make_loader
from dataio.batch import PackedBytes

SIZES = [13, 0, 7, 1, 22, 5]  # deliberately uneven, with an empty and a one-sample shard
TOTAL = sum(SIZES)
ALL_KEYS = {f"{i:06d}" for i in range(TOTAL)}


def real_keys(batches: list[dict]) -> list[str]:
    """Keys of the real (mask True) samples, in delivery order."""
    return [k for b in batches for k, m in zip(b["__key__"], b["mask"].tolist()) if m]


def run_epoch(url: str, **options: Any) -> tuple[list[dict], int]:
    """(batches, len before iterating) of one whole epoch of a fresh loader."""
    with make_loader(url, **options) as loader:
        steps = len(loader)
        return list(loader), steps


def take(loader: Any, num_batches: int) -> list[dict]:
    """The first num_batches batches of an iteration, then break out of it."""
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == num_batches:
            break
    return out


def batch_summary(batch: dict) -> tuple:
    """What must match between an uninterrupted and a resumed run: keys, mask, labels, batch
    number, and the delivered content of every other field (decoded pixels included)."""
    timing = ("read_s", "decode_s")
    fields = tuple((name, _content(batch[name])) for name in sorted(batch) if name not in timing)
    return (tuple(batch["__key__"]), tuple(batch["mask"].tolist()), fields)


def _content(value: Any) -> Any:
    if isinstance(value, PackedBytes):
        return tuple(value.to_list())
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), value.numpy().tobytes())
    return value


def summary_keys(summary: tuple) -> list[str]:
    """`real_keys` for a batch_summary: the keys not flagged as padding."""
    keys, mask = summary[0], summary[1]
    return [k for k, m in zip(keys, mask) if m]


def cleaned_memory_root(root: str) -> Iterator[str]:
    """A fixture's body: yield the memory:// `root`, then remove whatever the test wrote under it."""
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
