"""Decode raw image batches on the GPU: one device decoder call and one batched crop/resize per batch.

The crop box and flip of every sample are computed here from its header with the CPU path's
arithmetic and per-sample seeds (dataio.rand, via device_batch.plan_row), so a sample's augmentation
depends on (seed, epoch, sample id) only, whichever device decoded it. JPEGs (RGB or grey) go to the
device decoder (gpu_codecs: nvImageCodec, else torchvision's nvJPEG); everything else (PNG, WebP,
CMYK, 16-bit, no header, over the pixel limit) and every sample the device decoder refuses is decoded
by CpuDecoder inside the same batch, under the loader's corrupt-sample policy. Each sample is
decoded exactly once, by one of the two. Decoded images (whole, or only the crop where the decoder
decodes regions) become the batch's (N, 3, size, size) tensor in one crop_resize call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dataio.decode.cpu import DecodeConfig
from dataio.decode.device_batch import MainProcessDecoder, RowFixer, image_items, plan_row, sample_seeds
from dataio.decode.gpu_codecs import DeviceCodec
from dataio.decode.gpu_crop import crop_resize
from dataio.decode.images import IMAGE_FIELD_ORDER
from dataio.decode.transforms import CropBox

ON_CORRUPT = ("raise", "skip")
DEVICE_FORMATS = ("jpeg",)  # the rest go to the CPU path
DEVICE_MODES = ("RGB", "L")  # CMYK/YCCK JPEGs: the CPU path (PIL inverts Adobe CMYK)


class GpuDecoder(MainProcessDecoder):
    """`dec(batch)`: one raw batch (image bytes as PackedBytes, "__id__" and "epoch" as the loader's
    GPU feed adds them) -> the batch with "image" (N, 3, size, size) uint8 (float32 if normalize) on
    the codec's device, on the current CUDA stream. `codec` None: every sample on the CPU path."""

    def __init__(self, decode_config: DecodeConfig, *, seed: int, codec: DeviceCodec | None, on_corrupt: str = "raise",
                 url_of: Callable[[int], str] | None = None, image_fields: tuple[str, ...] = IMAGE_FIELD_ORDER,
                 device: torch.device | None = None) -> None:
        if not isinstance(decode_config, DecodeConfig):
            raise TypeError(f"decode_config must be a dataio.decode.cpu.DecodeConfig, got {type(decode_config).__name__}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
        self.config, self.seed, self.codec = decode_config, seed, codec
        self.device = codec.device if codec is not None else (device or torch.device("cpu"))
        self.image_fields = tuple(image_fields)
        self.epoch = 0
        self._rows = RowFixer(decode_config, on_corrupt=on_corrupt, url_of=url_of)
        self.num_device_samples = 0  # samples the device decoder decoded
        cfg = decode_config
        self._mean_std = (torch.tensor(cfg.mean), torch.tensor(cfg.std)) if cfg.normalize else None

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        fields, items = image_items(batch, self.image_fields)
        keys = [str(k) for k in batch["__key__"]]
        if len(keys) != len(items) or not items:
            raise ValueError(f"batch has {len(keys)} keys and {len(items)} images; expected as many, at least 1")
        seeds = sample_seeds(batch, keys, seed=self.seed, epoch=self.epoch)
        plans = [plan_row(self.config, item, s, formats=DEVICE_FORMATS, modes=DEVICE_MODES) if self.codec else None
                 for item, s in zip(items, seeds)]
        size, n = self.config.size, len(items)
        dtype = torch.float32 if self.config.normalize else torch.uint8
        images = torch.empty((n, 3, size, size), dtype=dtype, device=self.device)
        device_rows = [i for i, p in enumerate(plans) if p is not None]
        refused = self._decode_on_device(items, plans, device_rows, images)
        cpu_rows = sorted([i for i, p in enumerate(plans) if p is None] + refused)
        done, bad = self._rows.decode_rows(batch, fields, items, seeds, cpu_rows)
        if done:  # one host-to-device copy for the batch's CPU rows
            rows = list(done)
            images[rows] = torch.stack([done[i] for i in rows]).to(self.device, non_blocking=True)
        return self._rows.output(batch, fields, images, bad, time.perf_counter() - start)

    def _decode_on_device(self, items: list[np.ndarray], plans: list[tuple[CropBox, bool] | None],
                          rows: list[int], images: torch.Tensor) -> list[int]:
        """Decode `rows` with the codec into `images`; the rows it refused."""
        if not rows:
            return []
        decoded = self.codec.decode([items[i] for i in rows], [plans[i][0] for i in rows])  # type: ignore[index,union-attr]
        kept = [(i, d) for i, d in zip(rows, decoded) if d is not None]
        if kept:
            boxes = torch.tensor([_box_in(plans[i][0], cropped) for i, (_, cropped) in kept], dtype=torch.int64)  # type: ignore[index]
            flips = torch.tensor([plans[i][1] for i, _ in kept], dtype=torch.bool)  # type: ignore[index]
            crops = crop_resize([image for _, (image, _) in kept], boxes, flips, size=self.config.size,
                                mean_std=self._mean_std)
            images[[i for i, _ in kept]] = crops
            self.num_device_samples += len(kept)
        return [i for i, d in zip(rows, decoded) if d is None]


def _box_in(box: CropBox, cropped: bool) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the crop in what the decoder returned: the crop itself, or the image."""
    return (0, 0, box.height, box.width) if cropped else (box.top, box.left, box.height, box.width)
