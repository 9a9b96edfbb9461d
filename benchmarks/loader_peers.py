"""The loaders the benchmark compares, each built the way its users build it.

Every builder returns an iterable of batches (one pass = one epoch) and a function that counts
(samples, payload bytes) in a batch. Peers get the idiomatic pipeline of their library; the
"+our decoder" variant gives webdataset shardify's decoder so the comparison can also isolate
I/O and transport from decoding.
"""

from __future__ import annotations

import io
import math
import os
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

SIZE = 224


def pil_random_resized_crop(img: Image.Image, rng: random.Random, size: int = SIZE) -> np.ndarray:
    """torchvision's RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) + flip on a PIL image -> CHW uint8."""
    width, height = img.size
    area = width * height
    box = (0, 0, width, height)
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    out = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out).transpose(2, 0, 1).copy()


def _pil_decode_augment(data: bytes, rng: random.Random) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return pil_random_resized_crop(img, rng)


def _count_raw(batch: Any) -> tuple[int, int]:
    items, _labels = batch
    return len(items), sum(len(b) for b in items)


def _count_decoded(batch: Any) -> tuple[int, int]:
    images, _labels = batch
    return int(images.shape[0]), int(images.numel())


def _collate_raw(samples: list[tuple[bytes, Any]]) -> tuple[list[bytes], torch.Tensor]:
    return [s[0] for s in samples], torch.tensor([int(s[1]) for s in samples])


def _collate_decoded(samples: list[tuple[np.ndarray, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.stack([s[0] for s in samples])), torch.tensor([int(s[1]) for s in samples])


def register_webdataset_s3() -> None:
    """Let webdataset open s3:// URLs through fsspec (endpoint and keys from the AWS_* variables)."""
    import importlib

    import fsspec

    gopen = importlib.import_module("webdataset.gopen")  # `webdataset.gopen` the attribute is the function

    def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> Any:
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        fs = fsspec.filesystem("s3", client_kwargs={"endpoint_url": endpoint} if endpoint else {})
        return fs.open(url, mode, block_size=8 * 2**20)

    gopen.gopen_schemes["s3"] = gopen_s3


def webdataset_loader(urls: list[str], *, task: str, batch_size: int, num_workers: int,
                      decoder: str = "pil") -> tuple[Iterable, Callable]:
    """WebDataset + WebLoader with shard shuffle and a shuffle buffer, as its README shows."""
    import webdataset as wds

    if any(u.startswith("s3://") for u in urls):
        register_webdataset_s3()
    ds = wds.WebDataset(urls, shardshuffle=100, nodesplitter=wds.split_by_node, empty_check=False).shuffle(1000)
    if task == "raw":
        ds = ds.to_tuple("jpg", "cls").batched(batch_size, collation_fn=_collate_raw, partial=True)
        count = _count_raw
    else:
        rng = random.Random(0)
        if decoder == "ours":
            from dataio.decode.cpu import CpuDecoder, DecodeConfig

            dec = CpuDecoder(DecodeConfig(size=SIZE))
            fn = lambda data: dec.decode(data, seed=rng.getrandbits(62))  # noqa: E731
        else:
            fn = lambda data: _pil_decode_augment(data, rng)  # noqa: E731
        ds = ds.to_tuple("jpg", "cls").map_tuple(fn, lambda c: c)
        ds = ds.batched(batch_size, collation_fn=_collate_decoded, partial=True)
        count = _count_decoded
    loader = wds.WebLoader(ds, batch_size=None, num_workers=num_workers, persistent_workers=num_workers > 0)
    return loader, count


class _FilesDataset(torch.utils.data.Dataset):
    """torchvision ImageFolder's shape: one file per sample, PIL decode in __getitem__."""

    def __init__(self, root: str, task: str) -> None:
        classes = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
        self.items = [(str(f), i) for i, c in enumerate(classes) for f in sorted((Path(root) / c).iterdir())]
        self.task = task
        self.rng = random.Random(0)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        path, label = self.items[i]
        with open(path, "rb") as f:
            data = f.read()
        return (data if self.task == "raw" else _pil_decode_augment(data, self.rng)), label


def plain_loader(root: str, *, task: str, batch_size: int, num_workers: int) -> tuple[Iterable, Callable]:
    ds = _FilesDataset(root, task)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=batch_size, shuffle=True, num_workers=num_workers, persistent_workers=num_workers > 0,
        collate_fn=_collate_raw if task == "raw" else _collate_decoded,
    )
    return loader, _count_raw if task == "raw" else _count_decoded


def shardify_loader(url: str, *, task: str, batch_size: int, num_workers: int, decode: str = "cpu",
                    options: dict[str, Any] | None = None) -> tuple[Any, Callable]:
    """make_loader with its defaults; `options` overrides some (for ablations, not the table)."""
    from dataio import make_loader
    from dataio.storage.store import StorageOptions

    loader = make_loader(
        url, batch_size=batch_size, num_workers=num_workers, seed=0, rank=0, world_size=1,
        decode=None if task == "raw" else decode, image_size=SIZE, tail="pad",
        storage=StorageOptions.resolve(env=os.environ), **(options or {}),
    )

    def count(batch: dict) -> tuple[int, int]:
        n = int(batch["mask"].sum())  # padding repeats are not counted
        if "image" in batch:
            return n, int(batch["image"].numel())
        return n, sum(v.num_bytes for k, v in batch.items() if hasattr(v, "num_bytes"))

    return loader, count
