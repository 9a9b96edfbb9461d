"""Export scikit-learn's bundled digits (1,797 8x8 images, no download) as a train/val image folder.

Layout: OUT/train/<digit>/digit_00042.png and OUT/val/<digit>/..., RGB PNGs upscaled with
nearest-neighbour so the strokes stay crisp. The split is a fixed function of the sample index
and seed: the same on every machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True, kw_only=True, slots=True)
class DigitsExport:
    """How to export: output side in pixels, fraction held out for validation, split seed."""

    size: int = 32
    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.size < 8:
            raise ValueError("size must be at least 8 (the digits are 8x8)")
        if not 0 < self.val_fraction < 1:
            raise ValueError("val_fraction must be strictly between 0 and 1")


def split_indices(num_samples: int, labels: np.ndarray, config: DigitsExport) -> np.ndarray:
    """Boolean mask, True for validation: a seeded shuffle per class, so both splits hold every digit."""
    is_val = np.zeros(num_samples, dtype=bool)
    rng = np.random.default_rng(config.seed)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        chosen = rng.permutation(members)[: max(1, round(len(members) * config.val_fraction))]
        is_val[chosen] = True
    return is_val


def export_digits(out: str | os.PathLike[str], config: DigitsExport | None = None) -> dict[str, int]:
    """Write the PNG folders under `out`; returns the number of images per split."""
    from sklearn.datasets import load_digits

    config = config or DigitsExport()
    digits = load_digits()
    images, labels = digits.images, digits.target  # (N, 8, 8) floats in 0..16, (N,)
    is_val = split_indices(len(labels), labels, config)
    counts = {"train": 0, "val": 0}
    for index, (image, label) in enumerate(zip(images, labels)):
        split = "val" if is_val[index] else "train"
        folder = Path(out) / split / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        gray = np.clip(image * (255.0 / 16.0), 0, 255).astype(np.uint8)
        img = Image.fromarray(gray, "L").resize((config.size, config.size), Image.Resampling.NEAREST)
        img.convert("RGB").save(folder / f"digit_{index:05d}.png", format="PNG")
        counts[split] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.export_digits", description=__doc__)
    parser.add_argument("out", help="output folder; gets train/ and val/")
    parser.add_argument("--size", type=int, default=32, help="side of the exported images in pixels")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        config = DigitsExport(size=args.size, val_fraction=args.val_fraction, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    counts = export_digits(args.out, config)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
