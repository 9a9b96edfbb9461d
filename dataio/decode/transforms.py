"""Crop geometry and per-sample randomness for the decoders: pure arithmetic, no pixels, no I/O.

Randomness comes from dataio.rand (SampleRandom, seeded by sample_seed): the augmentation of a
sample depends only on (seed, epoch, sample id), whichever worker or machine decodes it, before
or after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dataio.rand import SampleRandom

JPEG_SCALE_DENOMS = (8, 4, 2, 1)  # DCT scaling that libjpeg does fast (1/8 .. 1); other M/8 are slower than full


@dataclass(frozen=True, slots=True)
class CropBox:
    """A crop in original pixel coordinates: rows [top, top + height), columns [left, left + width)."""

    top: int
    left: int
    height: int
    width: int


def random_resized_crop(
    height: int, width: int, rng: SampleRandom, *, scale: tuple[float, float], ratio: tuple[float, float]
) -> CropBox:
    """torchvision's RandomResizedCrop.get_params: 10 tries of area x aspect, then a central fallback."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return CropBox(rng.randint(0, height - h + 1), rng.randint(0, width - w + 1), h, w)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, max(1, min(height, round(width / ratio[0])))
    elif in_ratio > ratio[1]:
        h, w = height, max(1, min(width, round(height * ratio[1])))
    else:
        w, h = width, height
    return CropBox((height - h) // 2, (width - w) // 2, h, w)


def center_crop(height: int, width: int, *, fraction: float) -> CropBox:
    """The centred square covering `fraction` of the shorter side (resize shorter side, centre crop)."""
    side = max(1, min(height, width, round(min(height, width) * fraction)))
    return CropBox((height - side) // 2, (width - side) // 2, side, side)


def jpeg_scale_denom(height: int, width: int, box: CropBox, size: int) -> int:
    """Largest DCT downscale 1/d (d in 8, 4, 2, 1) after which the crop still spans >= size pixels."""
    for denom in JPEG_SCALE_DENOMS:
        scaled_h, scaled_w = -(-height // denom), -(-width // denom)  # libjpeg rounds up
        if box.height * scaled_h >= size * height and box.width * scaled_w >= size * width:
            return denom
    return 1
