"""Image-text pair batches in one run: shardify's loader with captions tokenized in its workers
(make_loader(tokenizer=, context_length=77)) against webdataset with the same tokenizer applied in
its pipeline, as open_clip does (decode, resize and centre-crop with PIL, tokenize, batch, a
DataLoader over the pipeline). Both read the same 8 tar shards (drawn pairs, tools/pair_data.py),
make uint8 [B, 3, S, S] images and int64 [B, 77] ids with the same tokenizer, with the same number
of worker processes.

    python -m benchmarks.bench_pairs [--pairs 2000] [--size 256] [--image-size 128] [--rounds 3]

Each configuration runs in a fresh child process, rounds interleaved, medians reported with the
runs; pairs/s counts the batches after the first. Results, with the machine described, go to
benchmarks/results_pairs.md. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTEXT_LENGTH = 77


def prepare(work: Path, num_pairs: int, size: int) -> dict[str, Any]:
    """The pair dataset (shardify write --captions of a drawn pair folder) and a tokenizer of its captions."""
    from sharding.cli import main as shardify
    from sharding.write.tokenizer import train_bpe
    from tools.pair_data import pair, write_pair_folder

    ds, tok = work / "pairs", work / "tokenizer.json"
    if not (ds / "manifest.json").exists():
        src = write_pair_folder(work / "src", num_pairs, size=size)
        # 8 shards: each of webdataset's workers gets whole shards (split_by_worker), as many as shardify's
        assert shardify(["write", str(src), str(ds), "--captions", "--quiet", "--overwrite",
                         "--max-samples-per-shard", str(max(1, -(-num_pairs // 8)))]) == 0
    if not tok.exists():
        train_bpe([c for i in range(300) for c in pair(i)[1]], 1000, str(tok))
    manifest = json.loads((ds / "manifest.json").read_text())
    return {"url": str(ds), "tokenizer": str(tok), "num_pairs": manifest["num_samples"],
            "shards": [str(ds / p) for p in manifest["shards"]["path"]]}


def shardify_batches(spec: dict[str, Any]) -> Any:
    from dataio import make_loader

    loader = make_loader(spec["url"], batch_size=spec["batch_size"], num_workers=spec["workers"],
                         image_size=spec["image_size"], train=False, shuffle=False, tokenizer=spec["tokenizer"],
                         context_length=CONTEXT_LENGTH)
    for batch in loader:
        assert batch["input_ids"].shape == (spec["batch_size"], CONTEXT_LENGTH)
        yield len(batch["input_ids"])
    loader.close()


class _Tokenize:
    """open_clip's tokenizer step: ids cut to context - 1 with the end token, padded: int64 [77]."""

    def __init__(self, path: str) -> None:
        self.path, self.tok, self.end = path, None, 0

    def __call__(self, text: str) -> Any:
        import torch
        from tokenizers import Tokenizer

        if self.tok is None:
            self.tok = Tokenizer.from_file(self.path)
            self.end = self.tok.token_to_id("<|endoftext|>")
        ids = self.tok.encode(text, add_special_tokens=False).ids[: CONTEXT_LENGTH - 1] + [self.end]
        out = torch.zeros(CONTEXT_LENGTH, dtype=torch.int64)
        out[: len(ids)] = torch.tensor(ids)
        return out


def _image(size: int) -> Any:
    def preprocess(img: Any) -> Any:
        import numpy as np
        import torch
        from PIL import Image

        scale = size / min(img.size)
        img = img.resize((max(size, round(img.width * scale)), max(size, round(img.height * scale))), Image.BILINEAR)
        left, top = (img.width - size) // 2, (img.height - size) // 2
        return torch.from_numpy(np.asarray(img.crop((left, top, left + size, top + size)))).permute(2, 0, 1)

    return preprocess


def webdataset_batches(spec: dict[str, Any]) -> Any:
    import torch
    import webdataset as wds

    pipeline = (wds.WebDataset(spec["shards"], shardshuffle=False, nodesplitter=None,
                               workersplitter=wds.split_by_worker, empty_check=False)
                .decode("pilrgb").to_tuple("jpg", "txt")
                .map_tuple(_image(spec["image_size"]), _Tokenize(spec["tokenizer"]))
                .batched(spec["batch_size"], partial=False))
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=spec["workers"])
    for images, ids in loader:
        assert ids.shape[1] == CONTEXT_LENGTH and images.dtype == torch.uint8
        yield len(ids)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Pairs/s over the batches after the first, and the first batch's seconds."""
    batches = {"shardify": shardify_batches, "webdataset": webdataset_batches}[spec["loader"]](spec)
    start = time.perf_counter()
    next(batches)
    first_s = time.perf_counter() - start
    start, pairs = time.perf_counter(), 0
    for n in batches:
        pairs += n
    return {"pairs_per_s": pairs / (time.perf_counter() - start), "first_s": first_s, "pairs": pairs,
            "load": os.getloadavg()[0]}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_pairs", "--child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, data: dict[str, Any], runs: dict[str, list[dict[str, Any]]], started: str,
           load: tuple[float, ...]) -> str:
    from tools.machine import machine_markdown

    med = {k: statistics.median(r["pairs_per_s"] for r in v) for k, v in runs.items()}
    names = {"shardify": "shardify, captions tokenized in its workers",
             "webdataset": "webdataset + the tokenizer in its pipeline (open_clip's way)"}
    lines = [
        "# Image-text pairs (issue 33)", "",
        f"Run {started}: `python -m benchmarks.bench_pairs --pairs {args.pairs} --size {args.size} --image-size "
        f"{args.image_size} --rounds {args.rounds}`; {data['num_pairs']} drawn pairs ({args.size} px JPEGs and "
        f"their captions, tools/pair_data.py) in tar shards; batch {args.batch_size}, {args.workers} worker "
        f"processes, resize and centre crop to {args.image_size} px (uint8), captions to int64 "
        f"[B, {CONTEXT_LENGTH}] with the same BPE tokenizer; each configuration a fresh process, rounds "
        "interleaved, medians over pairs/s after the first batch.", "",
        machine_markdown() + f" Load average at the start: {', '.join(f'{x:.1f}' for x in load)} on cores shared "
        "with other engineers' test runs; the ratio within one run is what to read.", "",
        "| loader | pairs/s, median | runs | first batch (s) | load |", "|---|---:|---|---:|---:|"]
    for key, results in runs.items():
        each = ", ".join(f"{r['pairs_per_s']:,.0f}" for r in results)
        lines.append(f"| {names[key]} | {med[key]:,.0f} | {each} "
                     f"| {statistics.median(r['first_s'] for r in results):.2f} | {results[-1]['load']:.1f} |")
    lines += ["", f"Ratio, shardify / webdataset: {med['shardify'] / med['webdataset']:.2f}x.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench_pairs"))
    p.add_argument("--pairs", type=int, default=2000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_pairs.md")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return 0
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    data = prepare(args.work, args.pairs, args.size)
    runs: dict[str, list[dict[str, Any]]] = {"shardify": [], "webdataset": []}
    for _ in range(args.rounds):
        for loader in runs:
            spec = {**data, "loader": loader, "batch_size": args.batch_size, "workers": args.workers,
                    "image_size": args.image_size}
            runs[loader].append(child(spec))
    text = report(args, data, runs, started, load)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
