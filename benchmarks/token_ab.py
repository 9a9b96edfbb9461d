"""The in-process token path (num_workers=0) of two source trees side by side with LitData, on a busy
machine: each child measures whole epochs after a warm one, in CPU seconds of its own process (what the
loader itself costs; wall time on shared cores mostly measures the other jobs) and in wall seconds, and
the time from make_loader to the first batch. Rounds alternate the children so that load shifts hit
them alike; the report takes each child's best epoch and the median of its rounds.

    python -m benchmarks.token_ab --data WORK [--trees /work/main /work/wt-spine] [--litdata TARGET]

WORK is a benchmarks/bench_tokens.py work folder (its prepare(): tokens/, info.json) with LitData
chunks of the same documents in WORK/litdata (token_peers.write_litdata); TARGET a folder holding
litdata (pip install --target TARGET --no-deps litdata lightning-utilities), run under this torch.
Not part of the tests or CI.
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

CHILD = r'''
import json, sys, time
spec = json.loads(sys.argv[1])
info = json.load(open(spec["work"] + "/info.json"))
L, B = spec["seq_len"], spec["batch_size"]
if spec["loader"] == "litdata":
    sys.path.insert(0, spec["litdata"])
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    t0 = time.perf_counter()
    ds = StreamingDataset(spec["work"] + "/litdata", item_loader=TokensLoader(block_size=L + 1), shuffle=True,
                          drop_last=True, seed=0)
    dl = StreamingDataLoader(ds, batch_size=B, num_workers=0)
    def epoch(e):
        ds.set_epoch(e + 1)
        return (int(b.shape[0]) * L for b in dl)
else:
    from dataio import make_loader
    t0 = time.perf_counter()
    loader = make_loader(info["url"], seq_len=L, batch_size=B, num_workers=0, rank=0, world_size=1,
                         fields=("input_ids",) if spec["ids_only"] else None)
    def epoch(e):
        loader.set_epoch(e)
        return (int(b["input_ids"].shape[0]) * (int(b["input_ids"].shape[1]) - 1) for b in loader)
it = epoch(0)
next(it)
first = time.perf_counter() - t0
sum(it)
cpu, wall = [], []
for e in range(1, spec["epochs"] + 1):
    c, w = time.process_time(), time.perf_counter()
    tokens = sum(epoch(e))
    cpu.append(tokens / (time.process_time() - c))
    wall.append(tokens / (time.perf_counter() - w))
print(json.dumps({"first_s": first, "cpu": max(cpu), "wall": max(wall)}))
'''


def run(spec: dict, tree: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": tree or ""}
    # cwd "/": a `-c` child puts its working directory first on sys.path, ahead of PYTHONPATH's tree
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                         timeout=900, cwd="/")
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--trees", nargs="+", default=[str(Path(__file__).resolve().parents[1])])
    ap.add_argument("--litdata", default=None)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = {"work": args.data, "seq_len": args.seq_len, "batch_size": args.batch_size, "epochs": args.epochs,
            "litdata": args.litdata}
    children = [(f"{Path(t).name}, {'input_ids only' if ids else 'default fields'}", t, {**base, "loader": "shardify",
                 "ids_only": ids}) for ids in (False, True) for t in args.trees]
    if args.litdata:
        children.append(("LitData StreamingDataset + TokensLoader", None, {**base, "loader": "litdata"}))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in children}
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        for name, tree, spec in children:
            got = {**run(spec, tree), "load": load}
            results[name].append(got)
            print(f"round {r} {time.strftime('%H:%M:%S')} {name}: {got}", flush=True)
    print("| loader | CPU M tokens/s (median of rounds) | wall M tokens/s | first batch s (wall) |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        ok = [x for x in runs if "error" not in x]
        if not ok:
            print(f"| {name} | error: {runs[0].get('error')} | | |")
            continue
        med = {k: statistics.median(x[k] for x in ok) for k in ("cpu", "wall", "first_s")}
        print(f"| {name} | {med['cpu'] / 1e6:.1f} | {med['wall'] / 1e6:.1f} | {med['first_s']:.3f} |")


if __name__ == "__main__":
    main()
