"""Crop geometry and per-sample randomness for the decoders: pure arithmetic, no pixels, no I/O.

Randomness comes from our own counter-based hash (splitmix64) rather than numpy's generators,
whose streams are not promised stable across versions: the augmentation of a sample depends only
on (seed, epoch, sample id), whichever worker or machine decodes it, before or after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15
JPEG_SCALE_DENOMS = (8, 4, 2, 1)  # DCT scaling that libjpeg does fast (1/8 .. 1); other M/8 are slower than full


def splitmix64(x: int) -> int:
    """One step of splitmix64's output function: a 64-bit bijective mix of x + golden ratio."""
    z = (x + _GOLDEN64) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_seed(seed: int, epoch: int, sample_id: int) -> int:
    """The 64-bit augmentation seed of one sample in one epoch; a pure function of its arguments."""
    h = splitmix64(int(seed) & _MASK64)
    h = splitmix64(h ^ (int(epoch) & _MASK64))
    return splitmix64(h ^ (int(sample_id) & _MASK64))


class SampleRandom:
    """A tiny splitmix64 stream of uniforms in [0, 1), seeded per sample."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = int(seed) & _MASK64

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        self._state = (self._state + _GOLDEN64) & _MASK64
        # splitmix64 already adds the constant; mixing the advanced state gives a fresh output.
        unit = (splitmix64(self._state) >> 11) * (1.0 / (1 << 53))
        return low + (high - low) * unit

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high)."""
        return low + min(int(self.uniform() * (high - low)), high - low - 1)


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
