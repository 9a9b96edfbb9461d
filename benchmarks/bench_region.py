"""JPEG region decode against the alternatives (one core), and the loader's DECODE row with and without it.

    python -m benchmarks.bench_region [--num-images 200] [--repeats 5] [--loader-repeats 3] [--no-loader]

Part 1, one core, bytes in memory, images per CPU-second of this process (torch and DALI on one
thread), candidates interleaved, medians: the full-size decode alone (this machine's full-decode
limit), today's path (simplejpeg's DCT-scaled decode + crop), PIL (draft + crop), DALI's CPU
`decoders.image_slice`, and region decode (with the extension's entropy decoder, and with
libjpeg's own); on baseline and progressive ~500x375 JPEGs.
Then where one image's time goes on the region path (decode, entropy floor, resize, layout).
Part 2, the loader: DECODE (2 workers, batch 256, 10k ImageNet-like JPEGs from tools.make_synthetic)
with region decode, with it switched off (today's code), and webdataset, each run in a fresh
process, rounds interleaved (bench_loader.run_child runs each). Writes the newest run at the top of
benchmarks/results_decode.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch
from PIL import Image

from benchmarks.bench_decode import make_jpegs, webdataset_style
from benchmarks.region_report import FULL, LOADER_SET, OURS, OURS_LIBJPEG, PEER, TODAY, prepend_report
from dataio.decode import region
from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.rand import sample_seed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZE = 224
Batch = Callable[[Sequence[bytes], int], None]  # fn(blobs, index of the first): decodes them all


def _per_image(fn: Callable[[bytes, int], object]) -> Batch:
    def run(blobs: Sequence[bytes], start: int) -> None:
        for i, data in enumerate(blobs):
            fn(data, start + i)
    return run


def _ours(decoder: str, train: bool = True) -> Batch:
    dec = CpuDecoder(DecodeConfig(size=SIZE, decoder=decoder, train=train))
    return lambda blobs, start: dec.decode_batch(blobs, seeds=[sample_seed(0, 0, start + i) for i in range(len(blobs))])


def _with_libjpeg_entropy(fn: Callable[[], object]) -> None:
    """fn() with libjpeg's own entropy decoder in place of the extension's (region.set_fast_entropy)."""
    before = region.set_fast_entropy(False)
    try:
        fn()
    finally:
        region.set_fast_entropy(before)


def _libjpeg_entropy(fn: Batch) -> Batch:
    return lambda blobs, start: _with_libjpeg_entropy(lambda: fn(blobs, start))


def _dali_cpu() -> Batch | None:
    """DaliDecoder on the CPU (decoders.image_slice, resize, crop_mirror_normalize), one thread."""
    try:
        from dataio.batch import PackedBytes
        from dataio.decode.dali import DaliDecoder
    except ImportError:
        return None
    dec = DaliDecoder(DecodeConfig(size=SIZE), batch_size=64, seed=0, num_threads=1, device="cpu")

    def run(blobs: Sequence[bytes], start: int) -> None:
        for s in range(0, len(blobs), 64):
            ids = list(range(start + s, start + min(len(blobs), s + 64)))
            dec({"__key__": [str(i) for i in ids], "jpg": PackedBytes.pack([blobs[i - start] for i in ids]),
                 "label": torch.zeros(len(ids), dtype=torch.int64), "mask": torch.ones(len(ids), dtype=torch.bool),
                 "__id__": torch.tensor(ids), "epoch": 0, "read_s": 0.0, "decode_s": 0.0, "batch_number": 0})
    return run


def candidates() -> dict[str, Batch]:
    rng = np.random.default_rng(0)
    rows = {FULL: _per_image(lambda d, i: simplejpeg.decode_jpeg(d)),
            TODAY: _ours("simplejpeg"), "RRC: PIL (draft + crop)": _ours("pil"), OURS: _ours("region"),
            OURS_LIBJPEG: _libjpeg_entropy(_ours("region")),
            PEER: _per_image(lambda d, i: webdataset_style(d, rng)),
            "centre crop: today": _ours("simplejpeg", train=False), "centre crop: region decode": _ours("region", False)}
    dali = _dali_cpu()
    if dali is not None:
        rows["RRC: DALI CPU decoders.image_slice"] = dali
    return rows


def rates(fns: dict[str, Batch], blobs: Sequence[bytes], repeats: int) -> dict[str, list[float]]:
    """Name -> images per CPU-second of this process, one value per interleaved pass (after a warm-up)."""
    for fn in fns.values():
        fn(blobs[:20], 0)
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.process_time()
            fn(blobs, 0)
            out[name].append(len(blobs) / max(time.process_time() - start, 1e-9))
    return out


def progressive(blobs: Sequence[bytes]) -> list[bytes]:
    """The same pictures re-encoded as progressive JPEGs (quality 90)."""
    out = []
    for data in blobs:
        buf = io.BytesIO()
        Image.open(io.BytesIO(data)).save(buf, format="JPEG", quality=90, progressive=True)
        out.append(buf.getvalue())
    return out


def scale_parity(blobs: Sequence[bytes]) -> tuple[int, float, float]:
    """(crops at a DCT scale < 1, mean and max of their mean absolute difference in grey levels)
    between the region path and a full-size decode + crop + the same antialiased resize."""
    from dataio.decode.cpu import _resize, _scaled_box
    from dataio.decode.transforms import jpeg_scale_denom

    ours = CpuDecoder(DecodeConfig(size=SIZE, decoder="region", flip=False))
    mads = []
    for i, data in enumerate(blobs):
        seed = sample_seed(0, 0, i)
        full = simplejpeg.decode_jpeg(data)
        height, width = full.shape[:2]
        box, _ = ours._plan(height, width, seed)
        if jpeg_scale_denom(height, width, box, SIZE) == 1:
            continue
        x0, y0, x1, y1 = _scaled_box(box, height, width, height, width)
        want = _resize(np.ascontiguousarray(full[y0:y1, x0:x1]), SIZE).astype(np.int16)
        mads.append(float(np.abs(ours.decode(data, seed=seed) - want).mean()))
    return len(mads), (statistics.mean(mads) if mads else 0.0), max(mads, default=0.0)


def parts(blobs: Sequence[bytes], repeats: int) -> dict[str, float]:
    """Microseconds of one core per image, median of interleaved passes, for each step of the region
    path on these JPEGs, and the entropy decoding it cannot skip (every row down to the window's
    bottom: a 1-pixel window on that row decodes all of it and almost nothing else)."""
    from dataio.decode.cpu import _resize_hwc, _scaled_box
    from dataio.decode.images import jpeg_header
    from dataio.decode.transforms import jpeg_scale_denom

    dec = CpuDecoder(DecodeConfig(size=SIZE, decoder="region"))
    seeds = [sample_seed(0, 0, i) for i in range(len(blobs))]
    jobs = []  # (data, denom, window, scaled (height, width), flip): what CpuDecoder decodes
    for data, seed in zip(blobs, seeds):
        height, width = jpeg_header(data)[:2]
        box, flip = dec._plan(height, width, seed)
        denom = jpeg_scale_denom(height, width, box, SIZE)
        hw = (-(-height // denom), -(-width // denom))
        jobs.append((data, denom, _scaled_box(box, height, width, *hw), hw, flip))
    crops = [region.decode_window(d, denom=n, window=w, scaled_hw=hw) for d, n, w, hw, _ in jobs]
    resized = [_resize_hwc(c, SIZE) for c in crops]
    slot = np.empty((3, SIZE, SIZE), dtype=np.uint8)

    def bottom_rows() -> list[object]:  # a 1-pixel window on the window's bottom row: its entropy decoding
        return [region.decode_window(d, denom=n, window=(w[0], w[3] - 1, w[0] + 1, w[3]), scaled_hw=hw)
                for d, n, w, hw, _ in jobs]

    steps: dict[str, Callable[[], object]] = {
        "header, crop and flip drawn": lambda: [dec._plan(*jpeg_header(d)[:2], s) for d, s in zip(blobs, seeds)],
        "region decode of the window": lambda: [region.decode_window(d, denom=n, window=w, scaled_hw=hw)
                                                for d, n, w, hw, _ in jobs],
        "  of which entropy decoding down to the window's bottom": bottom_rows,
        "  the same with libjpeg's own entropy decoder": lambda: _with_libjpeg_entropy(bottom_rows),
        "antialiased resize to 224 (interleaved out)": lambda: [_resize_hwc(c, SIZE) for c in crops],
        "planes + flip (C)": lambda: [region.to_planes(r, slot, flip=j[4]) for r, j in zip(resized, jobs)],
        "whole decode_batch, per image": lambda: dec.decode_batch(blobs, seeds=seeds),
        "full-size decode (simplejpeg), for scale": lambda: [simplejpeg.decode_jpeg(d) for d in blobs],
    }
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            start = time.process_time()
            fn()
            runs[name].append((time.process_time() - start) / len(blobs) * 1e6)
    return {name: statistics.median(v) for name, v in runs.items()}


def single_core(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-region-") as tmp:
        base = [p.read_bytes() for p in make_jpegs(Path(tmp) / "base", args.num_images)]
        large = [p.read_bytes() for p in make_jpegs(Path(tmp) / "large", 20, width=1600, height=1200)]
    sets = [("~500x375 baseline", base), ("~500x375 progressive", progressive(base[:100]))]
    loader_images = sorted(Path(args.work, f"images-{args.num_loader_images}").rglob("*.jpg"))[:args.num_images]
    if loader_images:  # the loader row's own images: the full-decode limit is taken from these
        sets.append((LOADER_SET, [p.read_bytes() for p in loader_images]))
    for label, blobs in sets:
        runs = rates(candidates(), blobs, args.repeats)
        out[label] = {name: {"median": statistics.median(v), "runs": [round(x) for x in v]} for name, v in runs.items()}
        for name, row in out[label].items():
            print(f"{label:>22} {name:<46} {row['median']:7.0f} images/CPU-s  {row['runs']}", flush=True)
    out["scale parity"] = scale_parity(large)
    out["parts"] = parts(sets[2][1] if len(sets) > 2 else base, args.repeats)  # the loader's images where present
    for name, us in out["parts"].items():
        print(f"{'parts':>22} {name:<58} {us:7.1f} us/image", flush=True)
    return out


# ---------------------------------------------------------------- the loader's DECODE row
def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One loader run (bench_loader.run_child); region decode switched off first where spec says so."""
    from benchmarks.bench_loader import run_child as loader_child

    if not spec.pop("region", True):
        region._region = None  # today's code: simplejpeg's whole-image decode (workers fork after this)
        region._WARNED.set()
    return loader_child(spec)


def prepare(work: Path, num_images: int) -> str:
    """The loader benchmark's data (tools.make_synthetic, shardify write), generated once under `work`."""
    folder, shards = work / f"images-{num_images}", work / f"shards-{num_images}"
    if not (folder / ".done").exists():
        subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(folder), "--num-images", str(num_images),
                        "--num-classes", str(min(1000, num_images)), "--seed", "0"], check=True)
        (folder / ".done").touch()
    if not (shards / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "sharding.cli", "write", str(folder), str(shards), "--format", "tar",
                        "--shard-size", "64MB", "--shuffle", "--seed", "0", "--overwrite", "--quiet"], check=True)
    return str(shards)


def loader_rows(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.bench_loader import tar_urls

    shards = prepare(Path(args.work), args.num_loader_images)
    base = {"task": "decode", "batch_size": 256, "num_workers": 2, "epochs": 2, "url": shards}
    specs = {"shardify, region decode": {**base, "loader": "shardify", "region": True},
             "shardify, today (region off)": {**base, "loader": "shardify", "region": False},
             "shardify, region decode, fresh buffers": {**base, "loader": "shardify",
                                                         "options": {"pooled_buffers": False}},
             "webdataset": {**base, "loader": "webdataset", "tars": tar_urls(shards)}}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
    for _ in range(args.loader_repeats):
        for name, spec in specs.items():
            load = os.getloadavg()[0]
            cmd = [sys.executable, "-m", "benchmarks.bench_region", "--child", json.dumps(spec)]
            out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1]) | {"load": (load + os.getloadavg()[0]) / 2}
            runs[name].append(result)
            print(f"  {name:<30} {result['samples_per_s']:7.0f} samples/s  {result['samples_per_cpu_s']:6.0f}/CPU-s  "
                  f"load {result['load']:.1f}", flush=True)
    return {name: {"median": statistics.median(r["samples_per_s"] for r in rs),
                   "per_cpu_s": statistics.median(r["samples_per_cpu_s"] for r in rs),
                   "runs": [round(r["samples_per_s"]) for r in rs], "load": [round(r["load"], 1) for r in rs]}
            for name, rs in runs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--num-images", type=int, default=200, help="~500x375 JPEGs for the single-core part")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-loader-images", type=int, default=10_000)
    parser.add_argument("--loader-repeats", type=int, default=3)
    parser.add_argument("--no-loader", action="store_true", help="only the single-core part")
    parser.add_argument("--work", default="out/bench-region", help="where the loader's data is generated and kept")
    parser.add_argument("--results", default=str(HERE / "results_decode.md"))
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    if not region.available():
        parser.exit(2, f"region decode is not built ({region.why_unavailable()}): {region.HOW_TO_BUILD}\n")
    load_start = os.getloadavg()
    single = single_core(args)
    loader = None if args.no_loader else loader_rows(args)
    prepend_report(Path(args.results), single, loader, args, load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
