"""Run under torchrun by tests/dataio/test_loader_dist.py: one rank of a real gloo job using the loader.

usage: dist_loader.py MODE[+MODE...] DATASET OUT_DIR [MODE DATASET OUT_DIR ...]
  several modes, or several (modes, dataset, folder) triples: in turn, in one job
  epoch     one epoch (2 workers); rank 0 writes the keys and steps gathered from every rank
  stop      deliver STOP_AFTER batches (2 workers); rank 0 saves its state; every rank writes its keys
  resume    load OUT_DIR/state.json (1 worker), deliver the rest; every rank writes its keys
  mismatch  the last rank opens a prefix without a manifest: every rank must fail, none hang
DATASET may be several URLs joined by '|': a 1:1 mixture (keys are then "SOURCE:KEY").
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch.distributed as dist

from dataio import make_loader

BATCH_SIZE = 3
STOP_AFTER = 2


def real_keys(batch: dict) -> list[str]:
    keys = batch["__key__"]
    if "source" in batch:  # a mixture: keys repeat across sources
        keys = [f"{s}:{k}" for s, k in zip(batch["source"].tolist(), keys)]
    return [k for k, m in zip(keys, batch["mask"].tolist()) if m]


def write(out_dir: str, name: str, doc: object) -> None:
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(doc, f)


def main(*args: str) -> None:
    """Each (MODES, DATASET, OUT_DIR) triple's modes ('+'-joined, e.g. epoch+stop) in turn, in one job:
    a loader of its own each."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    for i in range(0, len(args), 3):
        modes, url, out_dir = args[i:i + 3]
        for mode in modes.split("+"):
            run(mode, url, out_dir)
    dist.barrier()
    dist.destroy_process_group()


def run(mode: str, url: str, out_dir: str) -> None:
    rank = dist.get_rank()
    options = dict(batch_size=BATCH_SIZE, decode=None, shuffle_window=5, startup_timeout_s=30)
    if mode == "mismatch" and rank == dist.get_world_size() - 1:
        url = os.path.join(out_dir, "not-a-dataset")
    if "|" in url:
        options["weights"] = [1] * len(url.split("|"))
    try:
        loader = make_loader(url.split("|") if "|" in url else url, num_workers=1 if mode == "resume" else 2, **options)
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank saw
        write(out_dir, f"error-{rank}.json", {"type": type(exc).__name__, "message": str(exc)})
        raise
    with loader:
        if mode == "resume":
            with open(os.path.join(out_dir, "state.json")) as f:
                loader.load_state_dict(json.load(f))
        steps, keys = len(loader), []
        for batch in loader:
            keys += real_keys(batch)
            if mode == "stop" and batch["batch_number"] + 1 == STOP_AFTER:
                break
        if mode == "stop" and rank == 0:
            write(out_dir, "state.json", loader.state_dict())
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {"rank": rank, "keys": keys, "steps": steps,
                                          "world_size": loader.world_size})
    if rank == 0:
        write(out_dir, f"{mode}.json", gathered)


if __name__ == "__main__":
    main(*sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # As trainer/__main__.py: skip interpreter finalization, where torch's C++ threads can
    # abort a rank that finished cleanly ("terminate called without an active exception").
    os._exit(0)
