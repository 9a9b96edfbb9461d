"""gpu_check's race: each input feeding the same training loop, as a share of what the GPU can do.

Rows, one model and one loop (ResNet-50, bf16 autocast, channels_last, SGD, batch 256 on the GPU):
synthetic batches already on the device (the ceiling); torchvision ImageFolder + DataLoader;
make_loader(decode="cpu"), "gpu" and "auto". Each row: a few warm-up steps, then `steps` timed
steps (CUDA synchronized at both ends); samples/s and the share of the ceiling. The dry run uses
CPU twins: a small conv net in fp32, a PIL ImageFolder stand-in where torchvision is missing, and
gpu_feed.device_twin (the GPU path's own thread and code, the CPU standing in for the device).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

TARGETS = {"auto": 0.95, "gpu": 0.9}  # issue 31's targets, as shares of the synthetic ceiling


def make_model(device: torch.device, *, num_classes: int, dry_run: bool) -> tuple[torch.nn.Module, str]:
    """(model on `device` in channels_last, its name): torchvision's ResNet-50, or the dry run's small net."""
    if not dry_run:
        from torchvision.models import resnet50

        return resnet50(num_classes=num_classes).to(device, memory_format=torch.channels_last), "resnet50"
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, num_classes))
    return net.to(device, memory_format=torch.channels_last), "small conv net (dry run)"


class Loop:
    """One training step per batch: uint8 images -> float, normalized, channels_last; bf16 autocast on CUDA."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True).clamp_(min=0)
        x = ((images.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        cuda = self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(self.model(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], *, warmup: int, steps: int) -> dict[str, Any]:
        """samples/s over `steps` timed steps after `warmup` untimed ones."""
        for _ in range(warmup):
            self.step(*next(batches))
        self.sync()
        start, samples = time.perf_counter(), 0
        for _ in range(steps):
            images, labels = next(batches)
            self.step(images, labels)
            samples += len(labels)
        self.sync()
        return {"samples_per_s": samples / (time.perf_counter() - start), "steps": steps}


def forever(make_epoch: Callable[[int], Iterable[Any]], pick: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) over as many epochs as the loop asks for."""
    epoch = 0
    while True:
        for batch in make_epoch(epoch):
            yield pick(batch)
        epoch += 1


def synthetic(batch_size: int, size: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    images = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 2, (batch_size,), device=device)
    while True:
        yield images, labels


def imagefolder(folder: Path, *, batch_size: int, size: int, num_workers: int) -> tuple[Iterator[Any], Any, str]:
    """(batches, the DataLoader, name): torchvision's ImageFolder as its users write it, or a PIL stand-in."""
    try:
        from torchvision import datasets, transforms

        tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                 transforms.PILToTensor()])
        dataset: Any = datasets.ImageFolder(str(folder), transform=tf)
        name = "torchvision ImageFolder + DataLoader"
    except ImportError:
        dataset, name = _PilFolder(folder, size), "ImageFolder stand-in (PIL; no torchvision here) + DataLoader"
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                         pin_memory=torch.cuda.is_available(), drop_last=True,
                                         persistent_workers=num_workers > 0)
    return forever(lambda e: loader, lambda b: (b[0], b[1])), loader, name


class _PilFolder(torch.utils.data.Dataset):
    """class folders of JPEGs -> ((3, size, size) uint8, class): PIL decode and resize, no crop."""

    def __init__(self, folder: Path, size: int) -> None:
        self.items = [(p, c) for c, d in enumerate(sorted(folder.iterdir())) for p in sorted(d.iterdir())]
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as img:
            rgb = np.array(img.convert("RGB").resize((self.size, self.size)))
        return torch.from_numpy(rgb).permute(2, 0, 1).contiguous(), label


def shardify(url: str, decode: str, *, batch_size: int, size: int, num_workers: int) -> tuple[Iterator[Any], Any]:
    """(batches, the loader): make_loader with `decode`, batch dicts -> (image, label)."""
    from dataio import make_loader

    loader = make_loader(url, batch_size=batch_size, num_workers=num_workers, decode=decode, image_size=size,
                         pin_memory=torch.cuda.is_available() and decode == "cpu", rank=0, world_size=1)

    def epoch(e: int) -> Any:
        loader.set_epoch(e)
        return loader

    return forever(epoch, lambda b: (b["image"], b["label"])), loader


def race(url: str, folder: Path, *, sizes: Any, device: torch.device, dry_run: bool) -> dict[str, Any]:
    """Every row of the race (see the module docstring), each one's failure recorded rather than fatal."""
    from dataio.decode.gpu_codecs import CpuTwin
    from dataio.loader.gpu_feed import device_twin

    model, model_name = make_model(device, num_classes=2, dry_run=dry_run)
    loop = Loop(model, device)
    b, size, w = sizes.train_batch, sizes.image_size, sizes.num_workers
    rows: dict[str, Any] = {}

    def row(name: str, make: Callable[[], tuple[Iterator[Any], Any]]) -> None:
        start, batches, source = time.perf_counter(), None, None
        try:
            with device_twin(CpuTwin) if dry_run and name in ("gpu", "auto") else contextlib.nullcontext():
                batches, source = make()
                rows[name] = loop.run(batches, warmup=sizes.race_warmup, steps=sizes.race_steps)
                stats = getattr(source, "stats", None)
                if stats is not None and stats.gpu_decode:
                    rows[name]["gpu_decode"] = dict(stats.gpu_decode)
        except Exception as exc:  # noqa: BLE001 - one row's failure is a result, not the end of the race
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            _close(batches, source)
        rows[name]["seconds"] = round(time.perf_counter() - start, 1)

    row("synthetic", lambda: (synthetic(b, size, device), None))
    names = {}

    def folder_row() -> tuple[Iterator[Any], Any]:
        batches, loader, names["imagefolder"] = imagefolder(folder, batch_size=b, size=size, num_workers=w)
        return batches, loader

    row("imagefolder", folder_row)
    for decode in ("cpu", "gpu", "auto"):
        row(decode, lambda d=decode: shardify(url, d, batch_size=b, size=size, num_workers=w))
    ceiling = rows["synthetic"].get("samples_per_s")
    for r in rows.values():
        if ceiling and "samples_per_s" in r:
            r["share"] = r["samples_per_s"] / ceiling
    return {"model": model_name, "batch_size": b, "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
            "num_workers": w, "imagefolder": names.get("imagefolder", "ImageFolder"), "rows": rows}


def _close(batches: Any, source: Any) -> None:
    """The row's iteration first (a loader's GPU feed thread stops with it), then its loader's workers."""
    if hasattr(batches, "close"):
        batches.close()
    if hasattr(source, "close"):  # a ShardLoader
        source.close()
    iterator = getattr(source, "_iterator", None)  # a DataLoader's persistent workers
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
