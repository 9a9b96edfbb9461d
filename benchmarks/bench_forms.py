"""The per-sample forms' own cost, on the same batches: what consuming a RAW batch costs on top of
the loader, per sample, for each form of benchmarks/loader_child.py.

    python -m benchmarks.bench_forms [--shards out/bench/shards-10000 ...] [--rounds 5]

One process, num_workers=0: every batch the loader delivers is consumed in each form in turn
(the order rotating per batch), each timed alone, so the loader's own speed and the machine's
load drifts hit every form alike. Reported: microseconds per sample, the median over rounds (one
round = one epoch), and the ratios the issue's targets name. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from benchmarks.loader_child import FORMS, per_sample_count


def packed_count(batch: dict) -> tuple[int, int]:
    from dataio.batch import PackedBytes

    return int(batch["mask"].sum()), sum(v.num_bytes for v in batch.values() if isinstance(v, PackedBytes))


def one_round(loader: Any, epoch: int) -> dict[str, float]:
    """Seconds per sample each form took over one epoch of the same batches."""
    counts = {form: packed_count if form == "packed" else per_sample_count(form) for form in FORMS}
    seconds, samples = dict.fromkeys(FORMS, 0.0), 0
    loader.set_epoch(epoch)
    for i, batch in enumerate(loader):
        order = FORMS[i % len(FORMS):] + FORMS[:i % len(FORMS)]
        for form in order:
            start = time.perf_counter()
            n, _ = counts[form](batch)
            seconds[form] += time.perf_counter() - start
        samples += n
    return {form: s / samples for form, s in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", nargs="+", default=["out/bench/shards-10000", "out/bench/shards-2000-q78"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    from dataio import make_loader

    for url in args.shards:
        for reuse in (False, True):
            loader = make_loader(url, batch_size=args.batch_size, num_workers=0, seed=0, rank=0, world_size=1,
                                 decode=None, tail="pad", reuse_buffers=reuse)
            rounds = [one_round(loader, epoch) for epoch in range(args.rounds)]
            us = {form: statistics.median(r[form] for r in rounds) * 1e6 for form in FORMS}
            print(f"{url} (reuse_buffers={reuse}), medians of {args.rounds} epochs, us per sample: "
                  + ", ".join(f"{form} {us[form]:.2f}" for form in FORMS)
                  + f"; to_list {us['to_list, before'] / us['to_list']:.2f}x cheaper than before", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
