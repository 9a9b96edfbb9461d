"""The image paths (RAW and DECODE) of two or more source trees side by side, in one run, on a busy
machine: each child is a fresh process with PYTHONPATH set to its tree; after a warm epoch it
measures whole epochs (several per measure for RAW, whose epoch is short) in CPU seconds of its
process tree (what the loader costs; wall time on shared cores mostly measures the other jobs) and
in wall seconds, and the time from make_loader to the first batch, while the parent samples the PSS
of its process tree (main + workers). Rounds alternate the children so that load shifts hit them
alike; the report takes each child's best measure and the median of its rounds.

    python -m benchmarks.image_ab --data WORK [--trees /tmp/old-a51d023 /work/main] [--peers]

WORK holds a loader_data.prepare() folder (images-N, shards-N; made if missing, --num-images).
--peers runs every child under benchmarks/.peers-venv's torch (peers_env.py) and adds
torchvision's ImageFolder (DECODE), the memory comparison of benchmarks/results_loader.md.
Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.bench_loader import _tree_pss, warm_page_cache

HERE = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, sys, time
import psutil
spec = json.loads(sys.argv[1])
import torch
def tree_cpu():
    total = 0.0
    for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            t = p.cpu_times(); total += t.user + t.system
        except psutil.Error:
            pass
    return total
if spec["loader"] == "imagefolder":
    sys.path.insert(0, spec["bench_root"])
    from benchmarks.peers_tv import imagefolder_loader
    t0 = time.perf_counter()
    loader = imagefolder_loader(spec["folder"], task=spec["task"], batch_size=spec["batch_size"],
                                num_workers=spec["num_workers"])
    count = lambda b: int(len(b[0]))
else:
    from dataio import make_loader
    import dataio.loader.shard_loader
    t0 = time.perf_counter()
    loader = make_loader(spec["url"], batch_size=spec["batch_size"], num_workers=spec["num_workers"], seed=0,
                         rank=0, world_size=1, decode=None if spec["task"] == "raw" else "cpu", image_size=224,
                         tail="pad", **spec["options"])
    count = lambda b: int(b["mask"].sum())
def epoch(e):
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(e)
    return (count(b) for b in loader)
it = epoch(0)
next(it)
first = time.perf_counter() - t0
sum(it)
cpu, wall = [], []
for e in range(spec["measures"]):
    c, w = tree_cpu(), time.perf_counter()
    n = sum(sum(epoch(1 + e * spec["passes"] + k)) for k in range(spec["passes"]))
    cpu.append(n / (tree_cpu() - c))
    wall.append(n / (time.perf_counter() - w))
print(json.dumps({"first_s": first, "cpu": max(cpu), "wall": max(wall)}))
'''


def run(spec: dict[str, Any], tree: str, python: str) -> dict[str, Any]:
    """One child (a fresh process, PYTHONPATH=tree) with the PSS of its process tree sampled every
    0.1 s: its result plus peak PSS, in MiB, in all and per process (main, then workers)."""
    warm_page_cache({"loader": spec["loader"], "url": spec.get("url"), "folder": spec.get("folder")})
    env = {**os.environ, "PYTHONPATH": tree}
    child = subprocess.Popen([python, "-c", CHILD, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, text=True, cwd="/")
    peak: list[Any] = [0, []]
    done = threading.Event()

    def sample() -> None:
        proc = psutil.Process(child.pid)
        while not done.wait(0.1):
            try:
                now = _tree_pss(proc)
            except psutil.NoSuchProcess:
                return
            if sum(now) > peak[0]:
                peak[0], peak[1] = sum(now), now

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = child.communicate(timeout=1800)
    done.set()
    sampler.join()
    if child.returncode:
        return {"error": err.strip().splitlines()[-1:]}
    return {**json.loads(out.strip().splitlines()[-1]), "pss_mib": peak[0] / 2**20,
            "pss_parts_mib": [round(p / 2**20) for p in peak[1]]}


def children(args: argparse.Namespace, data: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(row name, tree, spec) of every child: each tree's RAW (2 workers, in process) and DECODE rows."""
    base = {"batch_size": args.batch_size, "url": data["shards"], "loader": "shardify", "options": {},
            "measures": args.measures}
    rows = [("raw, 2 workers", {"task": "raw", "num_workers": 2, "passes": args.raw_passes}),
            ("raw, in process", {"task": "raw", "num_workers": 0, "passes": args.raw_passes}),
            ("decode, 2 workers", {"task": "decode", "num_workers": 2, "passes": 1})]
    if args.peers or args.decode_only:  # the memory comparison: DECODE only
        rows = rows[2:]
    for option in args.option:  # e.g. pooled_buffers=False: one more DECODE row per tree
        key, value = option.split("=", 1)
        rows.append((f"decode, 2 workers, {option}", {**rows[-1][1], "options": {key: json.loads(value.lower())}}))
    out = [(f"{Path(t).name}: {name}", t, {**base, **spec}) for name, spec in rows for t in args.trees]
    if args.peers:
        out.append(("torchvision ImageFolder: decode, 2 workers", "", {
            "loader": "imagefolder", "folder": data["folder"], "bench_root": str(HERE), "task": "decode",
            "num_workers": 2, "batch_size": args.batch_size, "measures": args.measures, "passes": 1}))
    return out


def report(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The table of medians over each child's rounds (its PSS parts: the run nearest the median)."""
    lines = ["| child | CPU samples/s (tree) | wall samples/s | first batch s | peak PSS MiB (main + workers) | "
             "load | rounds |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        ok = [x for x in runs if "error" not in x]
        if not ok:
            lines.append(f"| {name} | error: {runs[0].get('error')} | | | | | |")
            continue
        med = {k: statistics.median(x[k] for x in ok) for k in ("cpu", "wall", "first_s", "pss_mib", "load")}
        parts = min(ok, key=lambda x: abs(x["pss_mib"] - med["pss_mib"]))["pss_parts_mib"]
        lines.append(f"| {name} | {med['cpu']:.0f} | {med['wall']:.0f} | {med['first_s']:.3f} | {med['pss_mib']:.0f} "
                     f"({' + '.join(map(str, parts))}) | {med['load']:.1f} | {len(ok)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--num-images", type=int, default=3000)
    ap.add_argument("--trees", nargs="+", default=[str(HERE)])
    ap.add_argument("--peers", action="store_true", help="children under the peers' torch, with ImageFolder")
    ap.add_argument("--decode-only", action="store_true", help="only the DECODE rows")
    ap.add_argument("--option", action="append", default=[], help="KEY=VALUE: one more DECODE row per tree")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--measures", type=int, default=3, help="timed measures per child after a warm epoch")
    ap.add_argument("--raw-passes", type=int, default=10, help="epochs per RAW measure (one epoch takes ~0.1 s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the run line, the machine and the table here")
    args = ap.parse_args()
    from benchmarks.loader_data import prepare

    data = prepare(Path(args.data), args.num_images, x4=False)
    python = sys.executable
    if args.peers:
        from benchmarks.peers_env import peers_python

        python = str(peers_python())
    todo = children(args, data)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in todo}
    started, load0 = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# {started}, load {load0}, python {python}")
    for r in range(args.rounds):
        for name, tree, spec in todo:
            load = os.getloadavg()[0]
            got = {**run(spec, tree, python), "load": load}
            results[name].append(got)
            print(f"round {r} {time.strftime('%H:%M:%S')} {name}: {got}", flush=True)
    table = report(results)
    print("\n".join(table))
    if args.out:
        from tools.machine import machine_markdown

        header = f"Run {started}: `python -m benchmarks.image_ab {' '.join(sys.argv[1:])}`, load at the start {load0}."
        Path(args.out).write_text("\n\n".join([header, machine_markdown(), "\n".join(table)]) + "\n")


if __name__ == "__main__":
    main()
