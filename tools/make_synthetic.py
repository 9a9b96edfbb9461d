"""A deterministic ImageNet-like image folder: one subfolder per class, JPEGs around 500x375, ~100 KB.

Each image is a smooth colour gradient plus blocky noise, so JPEG sizes and decode costs are
realistic, unlike flat colours. Image i depends only on (seed, i): the output is the same
whatever the number of processes.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True, kw_only=True, slots=True)
class SyntheticConfig:
    """What to generate; sizes vary around `width` x `height` by up to +-`size_jitter` (fraction)."""

    num_images: int
    num_classes: int
    seed: int = 0
    width: int = 500
    height: int = 375
    size_jitter: float = 0.2
    quality: int = 88

    def __post_init__(self) -> None:
        if self.num_images < 1 or self.num_classes < 1:
            raise ValueError("num_images and num_classes must be at least 1")
        if self.num_classes > self.num_images:
            raise ValueError(f"num_classes ({self.num_classes}) exceeds num_images ({self.num_images})")
        if self.width < 8 or self.height < 8 or not 0 <= self.size_jitter < 1:
            raise ValueError("need width, height >= 8 and 0 <= size_jitter < 1")
        if not 1 <= self.quality <= 100:
            raise ValueError("quality must be in 1..100")


def class_name(label: int) -> str:
    """Folder name of class `label`: ImageNet-like synset-style names that sort by label."""
    return f"n{label:08d}"


def image_path(config: SyntheticConfig, index: int) -> str:
    """Relative path of image `index`: classes round-robin, so every class gets images."""
    label = index % config.num_classes
    return f"{class_name(label)}/img_{index:08d}.jpg"


def render_jpeg(config: SyntheticConfig, index: int) -> bytes:
    """JPEG bytes of image `index`, a pure function of (config, index)."""
    rng = np.random.default_rng([config.seed, index])
    jitter = rng.uniform(1 - config.size_jitter, 1 + config.size_jitter, size=2)
    w, h = int(config.width * jitter[0]), int(config.height * jitter[1])
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(0, 255, size=3).astype(np.float32)
    slope = rng.uniform(-0.6, 0.6, size=(2, 3)).astype(np.float32)
    img = base + xs[..., None] * slope[0] + ys[..., None] * slope[1]  # (h, w, 3) gradient
    # Noise at two scales: fine grain (costly for JPEG) and 8x8 blocks (texture).
    fine = rng.standard_normal((h, w, 3), dtype=np.float32) * 28
    coarse = rng.standard_normal(((h + 7) // 8, (w + 7) // 8, 3), dtype=np.float32) * 40
    img += fine + np.repeat(np.repeat(coarse, 8, axis=0), 8, axis=1)[:h, :w]
    pixels = (255 - np.abs(np.mod(img, 510) - 255)).astype(np.uint8)  # reflect into 0..255, no flat clipping
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=config.quality)
    return buf.getvalue()


def _write_range(config: SyntheticConfig, out: str, start: int, stop: int) -> int:
    num_bytes = 0
    for index in range(start, stop):
        path = Path(out) / image_path(config, index)
        data = render_jpeg(config, index)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a crash never leaves a half-written image under a real name
        num_bytes += len(data)
    return num_bytes


def make_synthetic(out: str | os.PathLike[str], config: SyntheticConfig, *, num_procs: int | None = None) -> int:
    """Write the image folder under `out` (created; existing images are overwritten); returns bytes written."""
    out = os.fspath(out)
    for label in range(config.num_classes):
        os.makedirs(os.path.join(out, class_name(label)), exist_ok=True)
    num_procs = num_procs or os.cpu_count() or 1
    # Small jobs are faster in-process than paying for worker start-up.
    if num_procs == 1 or config.num_images <= 16:
        return _write_range(config, out, 0, config.num_images)
    step = max(16, -(-config.num_images // (num_procs * 8)))
    ranges = [(s, min(s + step, config.num_images)) for s in range(0, config.num_images, step)]
    with ProcessPoolExecutor(max_workers=num_procs) as pool:
        futures = [pool.submit(_write_range, config, out, s, e) for s, e in ranges]
        return sum(f.result() for f in futures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.make_synthetic", description=__doc__)
    parser.add_argument("out", help="output folder (one subfolder per class)")
    parser.add_argument("--num-images", type=int, default=10_000)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quality", type=int, default=88)
    parser.add_argument("--procs", type=int, default=None, help="processes (default: all cores)")
    args = parser.parse_args(argv)
    try:
        config = SyntheticConfig(num_images=args.num_images, num_classes=args.num_classes,
                                 seed=args.seed, quality=args.quality)
    except ValueError as exc:
        parser.error(str(exc))
    num_bytes = make_synthetic(args.out, config, num_procs=args.procs)
    print(f"wrote {config.num_images} images in {config.num_classes} classes, "
          f"{num_bytes / 1e6:.1f} MB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
