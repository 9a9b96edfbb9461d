"""Mixing cost, epoch by epoch: one dataset and the same images as a 1:1 two-source mixture, both
loaders alive in one process and their epochs alternated, so the load of a shared machine falls on
both alike (finer than bench_loader --mix, whose rows alternate fresh processes).

    python -m benchmarks.bench_mix --epochs 25      # appends its section to results_mix.md

RAW (decode=None), workers kept between epochs: each measured epoch's samples/s and samples per CPU-second
of the process tree (the loader and its workers), after one warm-up epoch each; medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Epoch-interleaved run (bench_mix.py)"


def tree_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process and its live children (the loader's workers are persistent)."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def measure(loaders: dict[str, Any], epochs: int) -> dict[str, dict[str, list[float]]]:
    """Per loader, each epoch's samples/s, samples per CPU-s and the 1-minute load; epoch 0 warms up."""
    me = psutil.Process()
    out: dict[str, dict[str, list[float]]] = {k: {"rate": [], "per_cpu": [], "load": []} for k in loaders}
    names = list(loaders)
    for epoch in range(epochs + 1):
        for name in names if epoch % 2 else names[::-1]:  # alternate who goes first
            loader = loaders[name]
            loader.set_epoch(epoch)
            cpu0, t0 = tree_cpu_s(me), time.perf_counter()
            n = sum(int(batch["mask"].sum()) for batch in loader)
            wall_s, cpu_s = time.perf_counter() - t0, tree_cpu_s(me) - cpu0
            if epoch:
                out[name]["rate"].append(n / wall_s)
                out[name]["per_cpu"].append(n / max(cpu_s, 1e-9))
                out[name]["load"].append(os.getloadavg()[0])
    return out


def report(res: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> list[str]:
    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in res.items()}
    single, mix = med["one dataset"], med["2-source mix"]
    wall_cost, cpu_cost = 1 - mix["rate"] / single["rate"], 1 - mix["per_cpu"] / single["per_cpu"]
    loads = [x for r in res.values() for x in r["load"]]
    lines = [
        SECTION, "",
        (f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python -m benchmarks.bench_mix --epochs "
        f"{args.epochs}`; the same data as above, num_workers={args.num_workers} (RAW tar: reader threads in the "
        f"loader's process, worker_mode='auto'), batch {args.batch_size}, RAW. Both loaders live in one process and alternate epochs ({args.epochs} measured each, after one "
        f"warm-up); medians. 1-minute load average during the run: {min(loads):.1f} to {max(loads):.1f} "
        f"(median {statistics.median(loads):.1f}) on {os.cpu_count()} cores."), "",
        "| loader | samples/s (median) | samples per CPU-s (median) | per-epoch samples/s, min-max |",
        "|---|---:|---:|---|",
    ]
    for name, r in res.items():
        lines.append(f"| {name} | {med[name]['rate']:.0f} | {med[name]['per_cpu']:.0f} | "
                     f"{min(r['rate']):.0f}-{max(r['rate']):.0f} |")
    lines += ["", (f"Mixing cost: wall clock {wall_cost:+.1%} (ratio {mix['rate'] / single['rate']:.3f}), CPU per "
              f"sample {cpu_cost:+.1%} (ratio {mix['per_cpu'] / single['per_cpu']:.3f}); target < 10%: "
              f"{'met' if max(wall_cost, cpu_cost) < 0.10 else 'NOT met'}."), ""]
    return lines


def write_section(path: Path, lines: list[str]) -> None:
    """Replace this benchmark's section of results_mix.md (or append it)."""
    text = path.read_text() if path.exists() else ""
    head = text.split(SECTION)[0].rstrip("\n")
    path.write_text((head + "\n\n" if head else "") + "\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=25, help="measured epochs per loader")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--work", default="out/bench", help="where data is generated and cached")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results_mix.md"))
    args = parser.parse_args()
    from benchmarks.bench_loader import prepare_halves, shardify
    from dataio import make_loader

    work = Path(args.work)
    folder, shards = work / f"images-{args.num_images}", work / f"shards-{args.num_images}"
    if not (folder / ".done").exists():
        import subprocess

        subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(folder), "--num-images",
                        str(args.num_images), "--num-classes", str(min(1000, args.num_images)), "--seed", "0"],
                       check=True)
        (folder / ".done").touch()
    if not (shards / "manifest.json").exists():
        shardify(folder, str(shards))
    halves = prepare_halves(work, str(folder))
    common = {"batch_size": args.batch_size, "num_workers": args.num_workers, "seed": 0, "rank": 0, "world_size": 1,
                  "decode": None, "tail": "pad"}
    # the halves' label names differ (each holds the classes of its images): one union label space
    mix_loader = make_loader(halves, weights=[1, 1], label_space="union", **common)
    with make_loader(str(shards), **common) as single, mix_loader as mix:
        res = measure({"one dataset": single, "2-source mix": mix}, args.epochs)
    lines = report(res, args)
    print("\n".join(lines))
    write_section(Path(args.output), lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
