"""What verify_checksums costs on the RAW path (decode=None): the per-sample xxh3 pass alone, and
loader epochs with and without it, interleaved (off, on, off, on, ...) so load changes hit both.
The Parquet form reads row groups bigger than the loader's window, in slices, so the pages are
checked as they stream: shardify's pages (with CRC-32s) and pages without CRCs (checked whole
first: read twice), each against verify off.

    python -m benchmarks.bench_verify [--format tar|parquet|both --samples-per-shard 256 --shards 8
                                       --sample-kb 110 --repeats 3]

Writes its section(s) of benchmarks/results_verify.md (between `<!-- bench_verify:FORMAT -->`
markers; text outside them, notes on earlier runs, is kept). A benchmark, not a test: nothing here
is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from tools.machine import machine_markdown
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


def epoch_rate(root: str, *, verify: bool, num_workers: int, **kw: Any) -> tuple[float, float]:
    """(samples per second, CPU milliseconds per sample: the process and its workers) of one RAW
    epoch (decode=None, reuse_buffers=True). CPU time is what load on a shared machine distorts least."""
    from dataio import make_loader

    loader = make_loader(root, batch_size=64, num_workers=num_workers, decode=None, reuse_buffers=True,
                         verify_checksums=verify, check_shards=False, seed=0, **kw)
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


def write_parquet(root: str, *, shards: int, per_shard: int, sample_bytes: int, page_crcs: bool) -> int:
    """Parquet shards of one row group each of random `bin` samples, with row-group checksums; pages
    with CRC-32s as shardify writes them, or the same pages without (as a Hugging Face export has
    them). Returns the shard bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dataio.format.checksums import file_row_group_sums
    from dataio.format.manifest import Field, Manifest, checksum_bytes, write_manifest
    from sharding.write.parquet import WRITE_BATCH_ROWS, ParquetShardWriter, parquet_schema

    store, rng = Store(root), random.Random(0)
    fields = (Field(name="bin", type="bytes"),)
    schema = parquet_schema((), False, fields)
    cols: dict[str, list[Any]] = {k: [] for k in ("path", "bytes", "sum", "groups", "group_sums")}
    for s in range(shards):
        rows = [{"__key__": f"{s * per_shard + i:08d}", "bin": rng.randbytes(sample_bytes)} for i in range(per_shard)]
        buf = io.BytesIO()
        if page_crcs:
            writer = ParquetShardWriter(buf, schema, rows_per_group=per_shard, bytes_per_group=1 << 40)
            for row in rows:
                writer.add(row)
            writer.close()
        else:
            table = pa.table({k: [r[k] for r in rows] for k in ("__key__", "bin")}, schema=schema)
            pq.write_table(table, buf, row_group_size=per_shard, compression="none", use_dictionary=False,
                           write_statistics=False, write_batch_size=WRITE_BATCH_ROWS, write_page_checksum=False)
        data, rel = buf.getvalue(), f"shards/shard-{s:06d}.parquet"
        store.write_bytes(rel, data)
        for k, v in zip(cols, (rel, len(data), checksum_bytes(data), (per_shard,),
                               file_row_group_sums(io.BytesIO(data)))):
            cols[k].append(v)
    write_manifest(store, Manifest(
        format="parquet", fields=fields, shard_paths=tuple(cols["path"]), shard_num_samples=(per_shard,) * shards,
        shard_num_bytes=tuple(cols["bytes"]), shard_checksums=tuple(cols["sum"]), row_groups=tuple(cols["groups"]),
        row_group_checksums=tuple(cols["group_sums"]), source="benchmarks.bench_verify"))
    return sum(cols["bytes"])


def page_check_rate(root: str) -> float:
    """GB/s of the page check alone (header walk, CRC-32 per page, the chunk's xxh3) over a shard's
    bytes in memory, fed in pyarrow's 1 MiB reads."""
    import pyarrow.parquet as pq

    from dataio.format.checksums import chunk_span
    from dataio.readers.page_check import Chunk, PageCheck

    store = Store(root)
    m = read_manifest(store)
    data = (Path(root) / m.shard_paths[0]).read_bytes()
    rg = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    chunks = [Chunk(*chunk_span(rg.column(i)), m.row_group_checksums[0][0][16 * i : 16 * (i + 1)],
                    rg.column(i).path_in_schema) for i in range(rg.num_columns)]
    view, best = memoryview(data), float("inf")
    for _ in range(3):
        check = PageCheck(chunks, fail=lambda bad: None, prove=lambda c: False)
        start = time.perf_counter()
        for a in range(0, len(data), 1 << 20):
            check.feed(a, view[a : a + (1 << 20)])
        best = min(best, time.perf_counter() - start)
    return len(data) / best / 1e9


def interleaved(roots: dict[str, str], *, repeats: int, num_workers: int, **kw: Any) -> dict[tuple[str, bool], tuple[float, float]]:
    """Per (dataset, verify): the medians of (samples/s, CPU ms/sample) of `repeats` epochs, run interleaved."""
    runs: dict[tuple[str, bool], list[tuple[float, float]]] = {(n, v): [] for n in roots for v in (False, True)}
    for name in roots:
        epoch_rate(roots[name], verify=False, num_workers=num_workers, **kw)  # warm the page cache and imports
    for _ in range(repeats):
        for name, verify in runs:
            runs[(name, verify)].append(epoch_rate(roots[name], verify=verify, num_workers=num_workers, **kw))
    return {k: (statistics.median(r for r, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}


def row(label: str, off: tuple[float, float], on: tuple[float, float]) -> str:
    return (f"| {label} | {off[0]:,.0f} | {on[0]:,.0f} | {on[0] / off[0]:.2f} | {off[1] * 1e3:.0f} | "
            f"{on[1] * 1e3:.0f} | {(on[1] - off[1]) * 1e3:+.0f} |")


HEADER = ["| num_workers | samples/s, verify off | verify on | on/off | CPU us/sample, off | on | difference |",
          "|---|---|---|---|---|---|---|"]


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def tar_section(args: argparse.Namespace, root: str) -> str:
    n, size = write_dataset(root, shards=args.shards, per_shard=args.samples_per_shard,
                            sample_bytes=args.sample_kb * 1024)
    gbps, us = hash_rate(root)
    rows = []
    for workers in (0, 2):
        r = interleaved({"tar": root}, repeats=args.repeats, num_workers=workers)
        rows.append(row(str(workers), r[("tar", False)], r[("tar", True)]))
    return "\n".join([
        "# verify_checksums on the RAW path", "",
        machine_markdown() + f" Load average at the end: {load()} (a shared machine).", "",
        f"Dataset: {args.shards} tar shards x {args.samples_per_shard} samples of {args.sample_kb} KB random bytes "
        f"({size / 1e6:.0f} MB, page cache warm), read with `make_loader(decode=None, reuse_buffers=True, "
        "batch_size=64)`.", "",
        f"The per-sample check alone (one xxh3-64 per sample over bytes in memory): {gbps:.1f} GB/s, "
        f"{us:.1f} us per sample.", "",
        f"Epochs after their first batch, medians of {args.repeats} interleaved runs each: samples/s, and CPU "
        "microseconds per sample (the process and its workers; what load distorts least):", "",
        *HEADER, *rows, "",
    ])


def parquet_section(args: argparse.Namespace, root: str) -> str:
    import warnings

    from dataio import VerifyCostWarning

    warnings.simplefilter("ignore", VerifyCostWarning)  # the double read is what is measured
    roots = {"crc": os.path.join(root, "crc"), "plain": os.path.join(root, "plain")}
    sizes = {name: write_parquet(path, shards=args.shards, per_shard=args.samples_per_shard,
                                 sample_bytes=args.sample_kb * 1024, page_crcs=name == "crc")
             for name, path in roots.items()}
    gbps, before = page_check_rate(roots["crc"]), load()
    window = max(1 << 20, args.samples_per_shard * args.sample_kb * 1024 // 4)  # a quarter of a row group
    rows = []
    for workers in (0, 2):
        r = interleaved(roots, repeats=args.repeats, num_workers=workers, shuffle_window_bytes=window)
        rows.append(row(f"{workers}, page CRCs", r[("crc", False)], r[("crc", True)]))
        rows.append(row(f"{workers}, no page CRCs (read twice)", r[("plain", False)], r[("plain", True)]))
    return "\n".join([
        "## Parquet row groups read in slices", "",
        f"Load average before the runs: {before}; at the end: {load()} (a shared machine).", "",
        f"Dataset: {args.shards} Parquet shards of one row group each, {args.samples_per_shard} samples of "
        f"{args.sample_kb} KB random bytes ({sizes['crc'] / 1e6:.0f} MB, page cache warm), pages of about 1 MiB, "
        "written by shardify's Parquet writer (a CRC-32 on every page) and again without page CRCs (a Hugging "
        f"Face export's layout); read with `make_loader(decode=None, reuse_buffers=True, batch_size=64, "
        f"shuffle_window_bytes={window / 2**20:.1f} MiB)`, a quarter of a row group, so every row group is read in slices and checked page by "
        "page as it streams (without CRCs: each chunk checked whole first, so read twice).", "",
        f"The page check alone (header walk, CRC-32 of each page, the chunk's xxh3; bytes in memory fed in "
        f"1 MiB reads): {gbps:.1f} GB/s.", "",
        f"Epochs after their first batch, medians of {args.repeats} interleaved runs each (off and on of both "
        "datasets in turn):", "",
        *HEADER, *rows, "",
    ])


def write_sections(sections: dict[str, str]) -> None:
    """Put each section between its markers in OUT, keeping every other line there."""
    text = OUT.read_text() if OUT.exists() else ""
    for name, body in sections.items():
        begin, end = f"<!-- bench_verify:{name} -->", f"<!-- /bench_verify:{name} -->"
        block = f"{begin}\n{body}\n{end}"
        if begin in text and end in text:
            text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
        else:
            text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    OUT.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--format", choices=("tar", "parquet", "both"), default="both")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples-per-shard", type=int, default=256)
    p.add_argument("--sample-kb", type=int, default=110)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    sections = {}
    for name, section in (("tar", tar_section), ("parquet", parquet_section)):
        if args.format in (name, "both"):
            with tempfile.TemporaryDirectory() as root:
                sections[name] = section(args, root)
                print(sections[name])
    write_sections(sections)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
