"""What writing fresh memory costs here: the first write of a new buffer pays the kernel's zeroing of
every page (and, in a VM, the host's fault for each page not yet backed), a buffer written before pays
only the copy. A RAW loader's first epoch writes its window buffers and batch storages for the first
time (a few hundred MB per process); later epochs reuse them.

    python -m benchmarks.profile_first_touch [--mb 350] [--repeats 5]

Prints CPU-seconds per GB of the first write with 4 KiB pages (numpy.empty: RawIo's window buffers),
on transparent huge pages (dataio.stream.slabs.huge_pages: the pooled batch storages), and of writing
the same buffer again. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def once(num_bytes: int, huge_first: bool = False) -> dict[str, float]:
    """CPU-s per GB: first write on 4 KiB pages, first write on huge pages, a second write (the first round
    of a process writes memory the process never had: run it with and without --huge-first to compare)."""
    import torch

    from dataio.stream.slabs import huge_pages

    def huge_array(n: int) -> np.ndarray:
        return torch.empty(0, dtype=torch.uint8).set_(huge_pages(torch.UntypedStorage(n))).numpy()

    gb = num_bytes / 1e9
    out = {}
    makers = (("4 KiB pages", lambda: np.empty(num_bytes, dtype=np.uint8)), ("huge pages", lambda: huge_array(num_bytes)))
    for name, make in makers[::-1] if huge_first else makers:
        buf = make()
        t = _cpu()
        buf[:] = 1
        out[f"first write, {name}"] = (_cpu() - t) / gb
        if name == "huge pages":
            t = _cpu()
            buf[:] = 2
            out["second write"] = (_cpu() - t) / gb
        del buf
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=350)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--huge-first", action="store_true", help="each round writes the huge-page buffer first")
    args = ap.parse_args()
    runs = [once(args.mb << 20, args.huge_first) for _ in range(args.repeats)]
    order = "huge pages first" if args.huge_first else "4 KiB pages first"
    print(f"{args.mb} MiB buffers, {args.repeats} rounds ({order}), load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| write | CPU-s/GB, median | runs |\n|---|---:|---|")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"| {key} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    print("(round 1: this process's first buffers)")


if __name__ == "__main__":
    main()
