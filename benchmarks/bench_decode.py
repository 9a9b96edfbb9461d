"""Single-core JPEG decode and decode+augment rates: simplejpeg, PIL, PIL draft, ours, a webdataset-style peer.

    .venv/bin/python -m benchmarks.bench_decode [--num-images 300] [--repeats 5] [--quick]

Everything runs in this one process on one thread, from bytes already in memory, so the figures
are the decoders' own cost. Writes benchmarks/results_decode.md with the machine described.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image

from benchmarks.region_report import MARK
from tools.machine import machine_markdown
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.decode.transforms import jpeg_scale_denom, random_resized_crop
from dataio.rand import SampleRandom, sample_seed

SIZE = 224
HERE = Path(__file__).resolve().parent


def make_jpegs(folder: Path, num_images: int, *, width: int = 500, height: int = 375, seed: int = 0) -> list[Path]:
    """Deterministic ImageNet-like JPEGs (gradients, waves, noise; quality 90; ~100 KB at 500x375)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(num_images):
        w, h = int(width * rng.uniform(0.88, 1.12)), int(height * rng.uniform(0.88, 1.12))
        if rng.uniform() < 0.25:  # some portrait images, as in ImageNet
            w, h = h, w
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        phase = rng.uniform(0, 6.28, 3)
        base = np.stack([x / w * 200 + 20, y / h * 200 + 20, 128 + 60 * np.sin(x / 23 + y / 37 + phase[0])], -1)
        pixels = np.clip(base + rng.normal(0, rng.uniform(16, 24), (h, w, 3)), 0, 255).astype(np.uint8)
        path = folder / f"{i:06d}.jpg"
        Image.fromarray(pixels).save(path, format="JPEG", quality=90)
        paths.append(path)
    return paths


def webdataset_style(data: bytes, rng: np.random.Generator) -> np.ndarray:
    """The peer: webdataset's decode("rgb8") (PIL, full size) + RandomResizedCrop in numpy, PIL resize."""
    with io.BytesIO(data) as stream:
        img = Image.open(stream)
        img.load()
        hwc = np.asarray(img.convert("RGB"))
    height, width = hwc.shape[:2]
    top, left, h, w = 0, 0, height, width
    for _ in range(10):  # torchvision's get_params
        area = height * width * rng.uniform(0.08, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = round(np.sqrt(area * aspect)), round(np.sqrt(area / aspect))
        if 0 < cw <= width and 0 < ch <= height:
            top, left, h, w = rng.integers(0, height - ch + 1), rng.integers(0, width - cw + 1), ch, cw
            break
    crop = Image.fromarray(hwc[top : top + h, left : left + w])
    out = np.asarray(crop.resize((SIZE, SIZE), Image.Resampling.BILINEAR))
    if rng.uniform() < 0.5:
        out = out[:, ::-1]
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def _pil_decode(data: bytes, draft: bool) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        if draft:
            img.draft("RGB", (img.width // 2, img.height // 2))
        return np.asarray(img.convert("RGB"))


def _simplejpeg_half(data: bytes, i: int) -> np.ndarray:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return simplejpeg.decode_jpeg(data, min_height=-(-height // 2), min_width=-(-width // 2))


def _ours(decoder: str) -> Callable[[bytes, int], np.ndarray]:
    dec = CpuDecoder(DecodeConfig(size=SIZE, decoder=decoder))
    return lambda data, i: dec.decode(data, seed=sample_seed(0, 0, i))


def candidates() -> dict[str, Callable[[bytes, int], object]]:
    """Name -> fn(bytes, index): decode-only rows first, then decode + RandomResizedCrop 224 + flip."""
    rng = np.random.default_rng(0)
    return {
        "decode only: simplejpeg, full size": lambda d, i: simplejpeg.decode_jpeg(d),
        "decode only: simplejpeg, 1/2 DCT scale": _simplejpeg_half,
        "decode only: PIL, full size": lambda d, i: _pil_decode(d, False),
        "decode only: PIL draft, 1/2 scale": lambda d, i: _pil_decode(d, True),
        "decode+RRC224+flip: ours, simplejpeg": _ours("simplejpeg"),
        "decode+RRC224+flip: ours, PIL": _ours("pil"),
        "decode+RRC224+flip: webdataset-style (PIL + numpy RRC)": lambda d, i: webdataset_style(d, rng),
    }


def rates(fns: dict[str, Callable[[bytes, int], object]], blobs: Sequence[bytes], repeats: int) -> dict[str, float]:
    """Name -> median images per CPU-second of this thread over `repeats` passes through all blobs.

    Passes are interleaved (every candidate once per round) and timed in thread CPU time, so load
    from other processes on a shared machine shifts all candidates alike and mostly cancels out.
    """
    for fn in fns.values():  # warm-up: imports, allocator, code paths
        for i, data in enumerate(blobs[: min(20, len(blobs))]):
            fn(data, i)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            for i, data in enumerate(blobs):
                fn(data, i)
            samples[name].append(len(blobs) / max(time.thread_time() - start, 1e-9))
    return {name: statistics.median(values) for name, values in samples.items()}


PEER = "decode+RRC224+flip: webdataset-style (PIL + numpy RRC)"


def single_core_decode_augment_rate(paths: Sequence[os.PathLike | str], repeats: int = 3) -> float:
    """The fastest single-core decode + RandomResizedCrop 224 + flip rate (images per CPU-second) here."""
    blobs = [Path(p).read_bytes() for p in paths]
    rows = {k: v for k, v in candidates().items() if k.startswith("decode+RRC")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # our resize runs in torch: one core, as in a DataLoader worker
    try:
        return max(rates(rows, blobs, repeats).values())
    finally:
        torch.set_num_threads(threads)


def reduced_share(blobs: Sequence[bytes]) -> float:
    """Fraction of samples whose RandomResizedCrop 224 lets the JPEG decode at 1/2 scale or less."""
    reduced = 0
    for i, data in enumerate(blobs):
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        box = random_resized_crop(height, width, SampleRandom(sample_seed(0, 0, i)), scale=(0.08, 1.0),
                                  ratio=(3 / 4, 4 / 3))
        reduced += jpeg_scale_denom(height, width, box, SIZE) > 1
    return reduced / len(blobs)


def _table(results: dict[str, float], blobs: Sequence[bytes]) -> list[str]:
    peer = results[PEER]
    lines = ["| path | images/s | vs webdataset-style |", "|---|---:|---:|"]
    for name, value in results.items():
        ratio = f"{value / peer:.2f}x" if name.startswith("decode+RRC") else ""
        lines.append(f"| {name} | {value:,.0f} | {ratio} |")
    kb = sum(len(b) for b in blobs) / len(blobs) / 1024
    ours = max(v for k, v in results.items() if k.startswith("decode+RRC224+flip: ours"))
    return lines + ["", f"{len(blobs)} images, mean {kb:.0f} KB. Reduced-size (DCT-scaled) decode applies to "
                        f"{reduced_share(blobs):.0%} of the crops. Fastest decode+augment: ours at "
                        f"{ours:,.0f} images/s, {ours / peer:.2f}x the webdataset-style path."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=300)
    parser.add_argument("--num-large", type=int, default=60, help="~1600x1200 JPEGs, where reduced decode pays")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="50 + 10 images, 2 repeats")
    parser.add_argument("--results", default=str(HERE / "results_decode.md"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one core, as in a DataLoader worker (torch's resize would use all)
    if args.quick:
        args.num_images, args.num_large, args.repeats = 50, 10, 2
    sections = {}
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        sets = (("~500x375", args.num_images, (500, 375)), ("~1600x1200", args.num_large, (1600, 1200)))
        for label, count, (w, h) in sets:
            blobs = [p.read_bytes() for p in make_jpegs(Path(tmp) / label, count, width=w, height=h)]
            results = rates(candidates(), blobs, args.repeats)
            for name, value in results.items():
                print(f"{label:>11} {name:<58} {value:8.0f} images/s", flush=True)
            sections[label] = (results, blobs)
    results = Path(args.results)
    old = results.read_text() if results.exists() else ""
    above = old[: old.index(MARK) + len(MARK)] + "\n\n" if MARK in old else ""  # bench_region's runs stay on top
    results.write_text(above + _report(sections, args.repeats))
    return 0


def _report(sections: dict, repeats: int) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    out = ["# CPU decode (single core)", "",
           f"{machine_markdown()} Load average at the end of the run: {load} (the machine may be shared).", "",
           "One thread, bytes in memory; images per CPU-second of that thread (so other load on the machine "
           f"matters less), median of {repeats} interleaved passes after a warm-up. "
           "RRC = RandomResizedCrop(224, scale (0.08, 1), ratio (3/4, 4/3)).", ""]
    for label, (results, blobs) in sections.items():
        out += [f"### {label} JPEGs (synthetic: gradients, waves, noise; quality 90)", "", *_table(results, blobs), ""]
    return "\n".join(out + NOTES) + "\n"


NOTES = [
    "### How our path gets there",
    "",
    "- `decoder=\"auto\"` uses simplejpeg (libjpeg-turbo straight into a numpy array) for JPEGs; PIL decodes "
    "other formats, CMYK/YCCK JPEGs, and JPEGs that simplejpeg's strict mode rejects (PIL still refuses "
    "truncated files). PIL's full-size JPEG decode is the slower of the two here (see the decode-only rows).",
    "- The crop is chosen from the header, then only the crop is copied and resized, with torch's uint8 "
    "antialiased bilinear kernel (AVX2): 2-3x faster than the Pillow wheel's BILINEAR on this machine "
    "for 300-375 pixel crops, and equal to it within one grey level. The flip is a strided copy into the batch tensor.",
    "- Reduced-size decode (DCT scaling 1/2, 1/4, 1/8, chosen so the crop still spans >= 224 pixels) "
    "almost never applies to ~500x375 images at 224: the crop would need >= 448 pixels both ways. It applies "
    "to most crops of large photos; these noisy synthetic JPEGs gain little from it, as entropy decoding, "
    "which scaling cannot skip, dominates them (photos with less noise may gain more; not measured here). "
    "Decoding only the crop's "
    "region (libjpeg-turbo's crop_scanline) is not exposed by simplejpeg or PIL.",
    "- `single_core_decode_augment_rate(paths)` (used by bench_loader for its 85% target) returns the best "
    "decode+RRC row above, in the same CPU-time units.",
]


if __name__ == "__main__":
    sys.exit(main())
