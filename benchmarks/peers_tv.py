"""The peers that need torchvision: MosaicML Streaming, LitData and torchvision's ImageFolder.

They run in their own virtual environment (benchmarks/.peers-venv: torch 2.14.1 + torchvision
0.29.1 from the local wheels, see peers_env.py), apart from the project's torch. Each reads its
own format written from the same image folder: Streaming its MDS shards, LitData its optimized
chunks, ImageFolder the files. DECODE is what their users write: PIL decode, torchvision's
RandomResizedCrop(224) and RandomHorizontalFlip, PILToTensor (uint8 CHW, like shardify's output).

    python -m benchmarks.peers_tv write FOLDER --mds DIR --litdata DIR   # once, cached by the caller
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

SHARD_BYTES = 64 * 10**6  # the same shard size as the tar shards


def folder_items(root: str) -> list[tuple[str, int]]:
    """(path, label) in ImageFolder's order: classes sorted, files sorted within each class."""
    classes = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
    return [(str(f), i) for i, c in enumerate(classes) for f in sorted((Path(root) / c).iterdir())]


def _sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def write_mds(folder: str, out: str) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, size_limit=SHARD_BYTES) as writer:
        for item in folder_items(folder):
            writer.write(_sample(item))


def write_litdata(folder: str, out: str) -> None:
    import litdata

    litdata.optimize(fn=_sample, inputs=folder_items(folder), output_dir=out, chunk_bytes=SHARD_BYTES,
                     num_workers=1, mode="overwrite")


# ---------------------------------------------------------------- reading
def _transform(task: str) -> Callable[[bytes], Any]:
    if task == "raw":
        return lambda data: data
    from PIL import Image
    from torchvision import transforms

    augment = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                  transforms.PILToTensor()])

    def decode(data: bytes) -> torch.Tensor:
        with Image.open(io.BytesIO(data)) as img:
            return augment(img.convert("RGB"))

    return decode


def _collate(task: str) -> Callable[[list[tuple[Any, int]]], Any]:
    def raw(samples: list[tuple[bytes, int]]) -> tuple[list[bytes], torch.Tensor]:
        return [s[0] for s in samples], torch.tensor([s[1] for s in samples])

    def decoded(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])

    return raw if task == "raw" else decoded


def streaming_loader(mds: str, *, task: str, batch_size: int, num_workers: int) -> Iterable:
    """StreamingDataset over local MDS shards + torch's DataLoader, as Streaming's docs show."""
    from streaming import StreamingDataset

    fn = _transform(task)

    class Images(StreamingDataset):
        def __getitem__(self, index: int) -> tuple[Any, int]:
            obj = super().__getitem__(index)
            return fn(obj["jpg"]), int(obj["cls"])

    ds = Images(local=mds, remote=None, shuffle=True, shuffle_seed=0, batch_size=batch_size)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=num_workers,
                                       persistent_workers=num_workers > 0, collate_fn=_collate(task))


def litdata_loader(chunks: str, *, task: str, batch_size: int, num_workers: int) -> Iterable:
    """litdata.StreamingDataset over its optimized chunks + its StreamingDataLoader."""
    import litdata

    fn = _transform(task)

    class Images(litdata.StreamingDataset):
        def __getitem__(self, index: Any) -> tuple[Any, int]:
            obj = super().__getitem__(index)
            return fn(obj["jpg"]), int(obj["cls"])

    ds = Images(input_dir=chunks, shuffle=True, seed=0)
    return litdata.StreamingDataLoader(ds, batch_size=batch_size, num_workers=num_workers,
                                       persistent_workers=num_workers > 0, collate_fn=_collate(task))


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def imagefolder_loader(folder: str, *, task: str, batch_size: int, num_workers: int) -> Iterable:
    """torchvision.datasets.ImageFolder + DataLoader(shuffle=True): one file per sample."""
    from torchvision import datasets

    fn = _transform(task)
    ds = datasets.ImageFolder(folder, loader=_read_bytes, transform=fn)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                       persistent_workers=num_workers > 0, collate_fn=_collate(task))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("write",))
    parser.add_argument("folder")
    parser.add_argument("--mds", required=True)
    parser.add_argument("--litdata", required=True)
    args = parser.parse_args(argv)
    write_mds(args.folder, args.mds)
    write_litdata(args.folder, args.litdata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
