"""All-reduce timings over a sweep of message sizes, for fitting latency and bandwidth.

Run by the scaling tool as `torchrun --nproc_per_node=2 -m trainer.scaling.comm_sweep --out FILE`; rank 0
writes {"world_size", "backend", "sizes_bytes": [...], "seconds": [...]} (one entry per repeat).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def sweep(sizes_bytes: list[int], *, repeats: int, device: torch.device) -> list[tuple[int, float]]:
    """(bytes, seconds) of a blocking float32 all-reduce per size and repeat; the slowest rank's time."""
    out = []
    for round_ in range(2):  # warm-up: connections and buffers of every size
        for size in sizes_bytes:
            dist.all_reduce(torch.ones(max(1, size // 4), dtype=torch.float32, device=device))
    del round_
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for i in range(repeats + 2):  # and two more rounds of this size
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the collective ends when its slowest rank does
            if i >= 2:
                out.append((tensor.numel() * 4, float(took.item())))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.scaling.comm_sweep", description=__doc__)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--min-bytes", type=int, default=4096)
    parser.add_argument("--max-bytes", type=int, default=16 * 2**20)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    sizes, size = [], args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    points = sweep(sizes, repeats=args.repeats, device=device)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": dist.get_world_size(), "backend": backend,
                       "sizes_bytes": [b for b, _ in points], "seconds": [s for _, s in points]}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as trainer/__main__.py: no interpreter finalization with torch's C++ threads about
