"""What the main-process decoders (DALI, the GPU decoder) share: a raw batch's rows, seeds and crop plans,
the rows they hand to the CPU path, and the corrupt-sample policy on the output batch.

A raw batch (the loader's decode=None / "dali" / "gpu" batches) holds each sample's image bytes in
PackedBytes fields. Every row gets the CPU path's per-sample seed (seed, epoch, sample id) and, from
its header alone, the CPU path's crop box and flip; a row a device decoder should not see (no
header, pixel limit, a format or colour mode it decodes differently) is planned None and decoded by
CpuDecoder, whose errors name the URL and key. Corrupt rows are replaced by the next good row and
masked out, exactly as the CPU path's collate does.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dataio.batch import PackedBytes
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.decode.images import check_pixels, read_header
from dataio.decode.transforms import CropBox, center_crop, random_resized_crop
from dataio.errors import CorruptSampleError
from dataio.rand import SampleRandom, sample_seed

SKIPPED_KEY = "__skipped__"  # same key as dataio.stream.worker: "URL#key" of substituted samples


def sample_seeds(batch: dict[str, Any], keys: list[str], *, seed: int, epoch: int) -> list[int]:
    """Per-sample seeds: the CPU path's (seed, epoch, sample id) when the batch has "__id__" (its own
    "epoch" winning over `epoch`); else seeded by the sample key."""
    epoch = int(batch.get("epoch", epoch))
    ids = batch.get("__id__")
    if ids is not None:
        return [sample_seed(seed, epoch, int(i)) for i in ids]
    return [sample_seed(seed, epoch, zlib.crc32(k.encode()) | (len(k) << 32)) for k in keys]


def plan_row(config: DecodeConfig, data: np.ndarray, seed: int, *, formats: Sequence[str],
             modes: Sequence[str]) -> tuple[CropBox, bool] | None:
    """(crop box, flip) from the header with CpuDecoder's draws, or None when the CPU path should decode
    this sample (no bytes, no readable header, over the pixel limit, a format or mode not listed)."""
    if not len(data):
        return None  # no image field in this sample: the CPU path reports it
    header = read_header(data)
    if header is None:
        return None
    try:
        check_pixels(header.width, header.height, max_pixels=config.max_pixels)
    except CorruptSampleError:
        return None  # the CPU decoder raises it again, naming the URL and key
    if header.format not in formats or header.mode not in modes:
        return None
    if not config.train:
        return center_crop(header.height, header.width, fraction=config.crop_fraction), False
    rng = SampleRandom(seed)  # same draws, in the same order, as CpuDecoder._plan
    box = random_resized_crop(header.height, header.width, rng, scale=config.scale, ratio=config.ratio)
    return box, config.flip and rng.uniform() < 0.5


def image_items(batch: dict[str, Any], order: tuple[str, ...]) -> tuple[tuple[str, ...], list[np.ndarray]]:
    """(the batch's raw image fields, each row's image bytes): per row the first of `order` holding
    non-empty bytes (absent fields are empty items in the loader's raw batches); empty if none."""
    fields = tuple(n for n in order if isinstance(batch.get(n), PackedBytes))
    if not fields:
        raise ValueError(
            f"batch has no raw image field (one of {list(order)} as PackedBytes; it has {sorted(batch)}); "
            "a main-process decoder needs the loader's raw batches (decode='dali' or 'gpu')"
        )
    columns = []
    for name in fields:
        packed: PackedBytes = batch[name]
        buf, offsets = packed.data.numpy(), packed.offsets.tolist()
        columns.append([buf[offsets[i]: offsets[i + 1]] for i in range(len(offsets) - 1)])
    items = []
    for row in zip(*columns):
        items.append(next((view for view in row if len(view)), row[0]))
    return fields, items


class MainProcessDecoder:
    """What DALI's and the GPU's decoders share: the epoch of batches that carry none, and the count of
    samples the CPU path decoded instead (their RowFixer, `_rows`)."""

    epoch: int
    _rows: RowFixer

    @property
    def num_cpu_samples(self) -> int:
        """Samples the CPU path decoded: not JPEG, refused or failed in the device decoder, or no codec."""
        return self._rows.num_cpu_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch mixed into the augmentation seeds of batches that carry no "epoch" of their own."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = epoch


class RowFixer:
    """The CPU side of a main-process decoder: rows decoded by CpuDecoder, corrupt rows substituted.

    `url_of(sample id)` names a sample's shard in errors (None: unnamed).
    """

    def __init__(self, config: DecodeConfig, *, on_corrupt: str, url_of: Callable[[int], str] | None) -> None:
        self.cpu = CpuDecoder(config)
        self.on_corrupt = on_corrupt
        self.url_of = url_of
        self.num_cpu_samples = 0  # samples this decoder's CPU path decoded

    def url(self, batch: dict[str, Any], row: int) -> str:
        ids = batch.get("__id__")
        if self.url_of is None or ids is None:
            return ""
        return self.url_of(int(ids[row]))

    def decode_rows(self, batch: dict[str, Any], fields: tuple[str, ...], items: list[np.ndarray],
                    seeds: list[int], rows: Sequence[int]) -> tuple[dict[int, torch.Tensor], list[int]]:
        """({row: (3, size, size) CPU tensor}, the rows that are corrupt under on_corrupt='skip')."""
        done, bad = {}, []
        keys = batch["__key__"]
        for i in rows:
            self.num_cpu_samples += 1
            try:
                if not len(items[i]):
                    url = self.url(batch, i)
                    raise CorruptSampleError(
                        f"{url}: sample {str(keys[i])!r} has no image (none of {list(fields)} holds bytes); "
                        "pass on_corrupt='skip' to leave such samples out, or fix the shard", url=url, key=str(keys[i]))
                arr = self.cpu.decode(items[i].tobytes(), seed=seeds[i], key=str(keys[i]), url=self.url(batch, i))
            except CorruptSampleError:
                if self.on_corrupt == "raise":
                    raise
                bad.append(i)
                continue
            done[i] = torch.from_numpy(arr)
        return done, bad

    def output(self, batch: dict[str, Any], fields: tuple[str, ...], images: torch.Tensor, bad: list[int],
               decode_s: float) -> dict[str, Any]:
        """The output batch: `images` in place of the raw fields, "__id__"/"epoch" dropped, corrupt
        rows substituted and masked out, "decode_s" increased."""
        n = len(images)
        out = {k: v for k, v in batch.items() if k not in (*fields, "__id__", "epoch")}
        mask = out.get("mask")
        mask = torch.ones(n, dtype=torch.bool) if mask is None else mask.clone()
        if bad:
            out[SKIPPED_KEY] = list(out.get(SKIPPED_KEY, [])) + self._substitute(batch, out, images, mask, bad)
        out["image"], out["mask"] = images, mask
        out["decode_s"] = float(out.get("decode_s", 0.0)) + decode_s
        return out

    def _substitute(self, batch: dict[str, Any], out: dict[str, Any], images: torch.Tensor, mask: torch.Tensor,
                    bad: list[int]) -> list[str]:
        """Replace each corrupt row of `out` by the next good one (cyclically), masked out, as the CPU
        path does; the skipped samples' descriptions."""
        keys, n = batch["__key__"], len(images)
        good = [i for i in range(n) if i not in set(bad)]
        if not good:
            url = self.url(batch, bad[0])
            raise CorruptSampleError(
                f"{url}: every sample of a batch is corrupt (first {keys[bad[0]]!r}); "
                "nothing to substitute with on_corrupt='skip': check the dataset", url=url, key=str(keys[bad[0]]),
            )
        skipped = [f"{self.url(batch, i)}#{keys[i]}" for i in bad]
        rows = {i: next((g for g in good if g > i), good[0]) for i in bad}
        for i, j in rows.items():
            images[i] = images[j]
            mask[i] = False
        substitute_rows(out, rows, n)
        return skipped


def substitute_rows(batch: dict[str, Any], rows: dict[int, int], n: int) -> None:
    """Row i of every per-sample entry (keys, labels, other fields) becomes row rows[i]'s, as the
    CPU path's substitute is the whole next good sample (collate.substitute); `image` and `mask`
    are the caller's, `__id__` stays (it names what was read)."""
    for name, value in list(batch.items()):
        if name in ("image", "mask", "__id__"):
            continue
        if isinstance(value, PackedBytes) and len(value) == n:
            items = value.to_list()
            batch[name] = PackedBytes.pack([items[rows.get(i, i)] for i in range(n)])
        elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
            value = batch[name] = value.clone()
            for i, j in rows.items():
                value[i] = value[j]
        elif isinstance(value, list) and len(value) == n:
            batch[name] = [value[rows.get(i, i)] for i in range(n)]
