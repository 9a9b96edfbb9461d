"""What verify_checksums costs on the RAW path (decode=None): the per-sample xxh3 pass alone, and
loader epochs with and without it, interleaved (off, on, off, on, ...) so load changes hit both.

    python -m benchmarks.bench_verify [--samples-per-shard 256 --shards 8 --sample-kb 110 --repeats 3]

Writes benchmarks/results_verify.md. A benchmark, not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.machine import machine_markdown
from dataio.format.manifest import read_manifest
from dataio.storage.store import Store
from tools.faults import Size, write_raw_dataset

OUT = Path(__file__).with_name("results_verify.md")


def write_dataset(root: str, *, shards: int, per_shard: int, sample_bytes: int) -> tuple[int, int]:
    """Tar shards of random `bin` samples (what the RAW path moves) with per-sample checksums, written as
    the fault suite writes its dataset; returns (samples, shard bytes)."""
    store = Store(root)
    size = Size(num_shards=shards, samples_per_shard=per_shard, sample_bytes=sample_bytes, images=0, epochs=1)
    n = write_raw_dataset(store, size)
    return n, int(sum(read_manifest(store).shard_num_bytes))


def hash_rate(root: str) -> tuple[float, float]:
    """(GB/s, microseconds per sample) of the per-sample check alone, over bytes already in memory."""
    from dataio.readers.tar import TarReader

    store = Store(root)
    reader = TarReader(store, read_manifest(store), verify_checksums=True)
    total_bytes, total_samples, seconds = 0, 0, 0.0
    for shard in range(reader.manifest.num_shards):
        index, sums = reader.index(shard), reader.sample_sums(shard)
        data = (Path(root) / reader.manifest.shard_paths[shard]).read_bytes()
        start = time.perf_counter()
        assert sums is not None and sums.first_bad(data, 0, 0, len(index)) is None
        seconds += time.perf_counter() - start
        total_bytes += sum(max(m.offset + m.size for m in s.members) - s.members[0].offset for s in index.samples)
        total_samples += len(index)
    return total_bytes / seconds / 1e9, seconds / total_samples * 1e6


def _cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of this process and its live children (loader workers) so far."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def epoch_rate(root: str, *, verify: bool, num_workers: int) -> tuple[float, float]:
    """(samples per second, CPU milliseconds per sample: the process and its workers) of one RAW
    epoch (decode=None, reuse_buffers=True). CPU time is what load on a shared machine distorts least."""
    from dataio import make_loader

    loader = make_loader(root, batch_size=64, num_workers=num_workers, decode=None, reuse_buffers=True,
                         verify_checksums=verify, check_shards=False, seed=0)
    proc = psutil.Process()
    try:
        loader.set_epoch(0)
        it = iter(loader)
        n = len(next(it)["__key__"])  # workers started: their start-up is not the epoch's cost
        cpu, start = _cpu_s(proc), time.perf_counter()
        for batch in it:
            n += len(batch["__key__"])
        return n / (time.perf_counter() - start), (_cpu_s(proc) - cpu) / n * 1e3
    finally:
        loader.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples-per-shard", type=int, default=256)
    p.add_argument("--sample-kb", type=int, default=110)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        n, size = write_dataset(root, shards=args.shards, per_shard=args.samples_per_shard,
                                sample_bytes=args.sample_kb * 1024)
        gbps, us = hash_rate(root)
        rows = []
        for workers in (0, 2):
            epoch_rate(root, verify=False, num_workers=workers)  # warm the page cache and the imports
            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(args.repeats):
                for verify in (False, True):
                    runs[verify].append(epoch_rate(root, verify=verify, num_workers=workers))
            off, on = (statistics.median(r for r, _ in runs[v]) for v in (False, True))
            cpu_off, cpu_on = (statistics.median(c for _, c in runs[v]) for v in (False, True))
            rows.append(f"| {workers} | {off:,.0f} | {on:,.0f} | {on / off:.2f} | {cpu_off * 1e3:.0f} | "
                        f"{cpu_on * 1e3:.0f} | {(cpu_on - cpu_off) * 1e3:+.0f} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    text = "\n".join([
        "# verify_checksums on the RAW path", "",
        machine_markdown() + f" Load average at the end: {load} (a shared machine).", "",
        f"Dataset: {args.shards} tar shards x {args.samples_per_shard} samples of {args.sample_kb} KB random bytes "
        f"({size / 1e6:.0f} MB, page cache warm), read with `make_loader(decode=None, reuse_buffers=True, "
        "batch_size=64)`.", "",
        f"The per-sample check alone (one xxh3-64 per sample over bytes in memory): {gbps:.1f} GB/s, "
        f"{us:.1f} us per sample.", "",
        f"Epochs after their first batch, medians of {args.repeats} interleaved runs each: samples/s, and CPU "
        "microseconds per sample (the process and its workers; what load distorts least):", "",
        "| num_workers | samples/s, verify off | verify on | on/off | CPU us/sample, off | on | difference |",
        "|---|---|---|---|---|---|---|", *rows, "",
    ])
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
