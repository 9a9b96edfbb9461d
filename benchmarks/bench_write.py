"""Write throughput: `shardify write` (tar, Parquet; local disk and S3) against webdataset's ShardWriter.

    python -m benchmarks.bench_write [--num-images 2000] [--repeats 3] [--shard-size 16MB] [--no-s3]

Every contender reads the same ImageNet-like folder (tools.make_synthetic, cached under out/bench,
page cache warmed first) and writes shards of the same size to the same disk. Runs are interleaved
(each repeat runs every contender once) and the median is reported, because the machine is shared.
Times are wall clock from the command's start to its last byte, scan and worker start-up included.
Results go to benchmarks/results_write.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sharding.cli import main as shardify
from sharding.flags import parse_size
from tools.machine import machine_markdown

HERE = Path(__file__).resolve().parent
TARGET_RATIO = 1.3


@dataclass
class Contender:
    name: str
    run: Callable[[Path], None]  # writes into the given empty directory
    seconds: list[float] = field(default_factory=list)


def ensure_data(out: Path, num_images: int, num_classes: int, seed: int) -> tuple[int, int]:
    """Create the synthetic folder once (it is reused while the parameters match); (files, bytes)."""
    from tools.make_synthetic import SyntheticConfig, make_synthetic

    stamp = out / ".params"
    params = f"{num_images} {num_classes} {seed}"
    if not (stamp.exists() and stamp.read_text() == params):
        shutil.rmtree(out, ignore_errors=True)
        print(f"generating {num_images} images in {out} (once) ...", flush=True)
        make_synthetic(out, SyntheticConfig(num_images=num_images, num_classes=num_classes, seed=seed))
        stamp.write_text(params)
    files = [p for p in out.rglob("*.jpg")]
    total = 0
    for p in files:  # warm the page cache so that nobody pays for the first read
        total += len(p.read_bytes())
    return len(files), total


def shardwriter_run(src: Path, shard_size_bytes: int) -> Callable[[Path], None]:
    """webdataset's usual loop: read each file's bytes, write {"__key__", "jpg", "cls"}."""

    def run(dest: Path) -> None:
        import webdataset as wds

        classes = sorted(d.name for d in src.iterdir() if d.is_dir())
        with wds.ShardWriter(str(dest / "shard-%06d.tar"), maxsize=shard_size_bytes, maxcount=10**9,
                             verbose=0) as sink:
            key = 0
            for label, name in enumerate(classes):
                for path in sorted((src / name).iterdir()):
                    with open(path, "rb") as f:
                        data = f.read()
                    sink.write({"__key__": f"{key:06d}", "jpg": data, "cls": label})
                    key += 1

    return run


def shardify_run(src: Path, flags: list[str], url_of: Callable[[Path], str] | None = None) -> Callable[[Path], None]:
    def run(dest: Path) -> None:
        target = url_of(dest) if url_of else str(dest)
        with contextlib.redirect_stdout(io.StringIO()):
            code = shardify(["write", str(src), target, "--quiet", *flags])
        if code != 0:
            raise RuntimeError(f"shardify write {' '.join(flags)} failed with exit code {code}")

    return run


def s3_contenders(src: Path, common: list[str], workers: int, shard_size: str, num_bytes: int,
                  stack: contextlib.ExitStack) -> list[Contender]:
    """shardify to a local SeaweedFS server, if tools.s3_server can start one."""
    try:
        from tools.s3_server import S3Server

        server = stack.enter_context(S3Server())
    except Exception as exc:  # noqa: BLE001 - the benchmark runs on without S3
        print(f"no S3 figure: cannot start SeaweedFS ({type(exc).__name__}: {exc})", file=sys.stderr)
        return []
    bucket = server.new_bucket()
    flags = [*common, "--workers", str(workers), "--endpoint-url", server.endpoint_url, "--access-key", server.key,
             "--secret-key", server.secret, "--region", "us-east-1", "--overwrite"]
    return [
        Contender(f"shardify tar -> S3 (SeaweedFS), structure check (default), {workers} workers",
                  shardify_run(src, flags, lambda dest: f"s3://{bucket}/{dest.name}")),
        Contender("upload ceiling: boto3 put_object of the same bytes (1 process, not a writer)",
                  upload_ceiling(server, bucket, num_bytes, parse_size(shard_size))),
    ]


def upload_ceiling(server, bucket: str, num_bytes: int, object_bytes: int) -> Callable[[Path], None]:  # noqa: ANN001
    """What this S3 server takes at most: the dataset's bytes as plain objects, no reading or checking."""
    blob = os.urandom(object_bytes)

    def run(dest: Path) -> None:
        for i in range(-(-num_bytes // object_bytes)):
            server.client().put_object(Bucket=bucket, Key=f"{dest.name}/raw-{i}", Body=blob)

    return run


def contenders(src: Path, shard_size: str, workers: int, s3: bool, num_bytes: int,
               stack: contextlib.ExitStack) -> list[Contender]:
    common = ["--shard-size", shard_size]
    out = [
        Contender("webdataset ShardWriter (1 process)", shardwriter_run(src, parse_size(shard_size))),
        Contender(f"shardify tar, structure check (default), {workers} workers",
                  shardify_run(src, [*common, "--workers", str(workers)])),
        Contender("shardify tar, structure check (default), 1 worker", shardify_run(src, [*common, "--workers", "1"])),
        Contender(f"shardify tar, full decode check, {workers} workers",
                  shardify_run(src, [*common, "--validate", "full", "--workers", str(workers)])),
        Contender(f"shardify tar, header check, {workers} workers",
                  shardify_run(src, [*common, "--validate", "header", "--workers", str(workers)])),
        Contender(f"shardify parquet, structure check (default), {workers} workers",
                  shardify_run(src, [*common, "--format", "parquet", "--workers", str(workers)])),
    ]
    if s3:
        out += s3_contenders(src, common, workers, shard_size, num_bytes, stack)
    return out


DAMAGES: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "cut at a random point": lambda d, r: d[: r.randrange(64, len(d) - 2)],
    "2 KB of garbage spliced in": lambda d, r: _splice(d, r, r.randbytes(2048)),
    "4 KB zeroed (a lost disk block)": lambda d, r: _splice(d, r, bytes(4096)),
    "16 random bytes": lambda d, r: _splice(d, r, r.randbytes(16)),
    "one bit flipped": lambda d, r: _splice(d, r, bytes([d[len(d) // 2] ^ (1 << r.randrange(8))]), len(d) // 2),
}


def _splice(data: bytes, rng: random.Random, piece: bytes, at: int | None = None) -> bytes:
    at = rng.randrange(len(data) // 8, len(data) - len(piece) - 2) if at is None else at
    return data[:at] + piece + data[at + len(piece):]


def catch_rates(src: Path, num_files: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """Fraction of damaged JPEGs each --validate level refuses, per kind of damage."""
    from dataio.decode import images
    from dataio.errors import CorruptSampleError

    checks = {"header": lambda d: images.read_header(d, fast_only=True) or images.probe(d),
              "structure (default)": images.check_structure, "full": images.validate}
    rng = random.Random(seed)
    files = sorted(src.rglob("*.jpg"))
    rates: dict[str, dict[str, float]] = {}
    for name, damage in DAMAGES.items():
        caught = dict.fromkeys(checks, 0)
        for path in rng.sample(files, min(num_files, len(files))):
            bad = damage(path.read_bytes(), rng)
            for level, check in checks.items():
                try:
                    check(bad)
                except CorruptSampleError:
                    caught[level] += 1
        rates[name] = {level: n / min(num_files, len(files)) for level, n in caught.items()}
    return rates


def measure(items: list[Contender], repeats: int, work: Path) -> None:
    for r in range(repeats):
        for i, c in enumerate(items):
            dest = work / f"c{i}-r{r}"
            dest.mkdir(parents=True)
            # Start every run with no dirty pages: nobody pays for the previous writer's writeback.
            os.sync()
            start = time.perf_counter()
            c.run(dest)
            c.seconds.append(time.perf_counter() - start)
            shutil.rmtree(dest, ignore_errors=True)
            print(f"  repeat {r + 1}/{repeats}  {c.name:<62} {c.seconds[-1]:6.2f} s", flush=True)


def paired_ratio(peer: Contender, c: Contender) -> float:
    """Median over repeats of peer seconds / contender seconds (> 1: the contender is faster)."""
    return statistics.median(p / x for p, x in zip(peer.seconds, c.seconds))


def report(items: list[Contender], num_files: int, num_bytes: int, args: argparse.Namespace,
           rates: dict[str, dict[str, float]]) -> str:
    base = statistics.median(items[0].seconds)
    lines = [
        "# Write throughput: shardify vs webdataset's ShardWriter",
        "",
        machine_markdown(),
        "",
        f"Data: {num_files} synthetic ImageNet-like JPEGs (tools.make_synthetic, {args.num_classes} classes, "
        f"{num_bytes / 1e6:.0f} MB, page cache warm); shards of {args.shard_size}; median of {args.repeats} "
        "interleaved repeats; wall time including the scan and worker start-up. Command: "
        f"`.venv/bin/python -m benchmarks.bench_write --num-images {args.num_images} --repeats {args.repeats}`.",
        "",
        "| writer | median s | samples/s | MB/s | vs ShardWriter (medians) | vs ShardWriter (median of per-repeat ratios) | all runs (s) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in items:
        s = statistics.median(c.seconds)
        lines.append(f"| {c.name} | {s:.2f} | {num_files / s:.0f} | {num_bytes / 1e6 / s:.0f} | {base / s:.2f}x | "
                     f"{paired_ratio(items[0], c):.2f}x | {', '.join(f'{x:.2f}' for x in c.seconds)} |")
    # Runs of one repeat sit next to each other in time, so their ratio is the least disturbed by
    # the load of a shared machine drifting during the benchmark.
    ratio = paired_ratio(items[0], items[1])
    met = "MET" if ratio >= TARGET_RATIO else "NOT MET"
    lines += [
        "",
        f"**Target** (`shardify write` with its default validation, tar from an image folder without "
        f"re-encoding, all cores, >= {TARGET_RATIO}x ShardWriter's samples/s): **{met}** on this machine: "
        f"{ratio:.2f}x ({items[1].name}; median of per-repeat ratios).",
        "",
        "Notes:",
        "- The default check (`--validate structure`) reads the pixel limit from the header and walks each "
        "file's framing to its end marker without decoding pixels (JPEG markers to EOI, PNG chunk CRCs to IEND, "
        "WebP RIFF and chunk sizes, GIF blocks to the trailer, BMP/PPM pixel-array sizes); only formats with no "
        "walk (TIFF, ...) and files whose walk objects are decoded, the decoder then judging. `--validate full` "
        "decodes every image (JPEG at 1/8 scale, every Huffman block still decoded): its row is the cost of "
        "the stronger check. `--validate header` checks the header only. ShardWriter checks nothing.",
        "- shardify also does what ShardWriter does not: an xxh3 checksum of every shard, the .idx index "
        "beside each shard, fsync + atomic rename of every shard, and the manifest.",
        f"- Load average when the benchmark started: {args.load_start}, on {os.cpu_count()} cores (other "
        "jobs share the machine); the spread between repeats is large (see the last column), which is why "
        "the target is judged on the median of per-repeat ratios (the runs of one repeat sit next to each "
        "other in time). `os.sync()` runs before every timed run, so no writer pays for another's writeback.",
        "- S3: shardify uploads each shard (one multipart upload per shard) to a SeaweedFS server on this "
        "same machine, which competes with the writers for the cores; the 'upload ceiling' row is what "
        "the server takes at most (the same bytes put from memory). ShardWriter has no S3 writer of its "
        "own, so there is no S3 peer figure.",
    ]
    one_worker = next((c for c in items if c.name.endswith(", 1 worker")), None)
    if one_worker is not None and paired_ratio(items[0], one_worker) >= ratio:
        lines.append(
            "- Here the all-cores run is no faster than the 1-worker run: with the machine this loaded, "
            "a second process finds no idle core. The lead over ShardWriter comes from a lower cost per "
            "sample (ustar headers built directly, a walk instead of a decode, one pass with no re-encoding), "
            "not from parallelism; on an idle many-core machine the workers add to it."
        )
    if rates:
        levels = list(next(iter(rates.values())))
        lines += ["", f"What each level refuses: {args.catch_samples} JPEGs of the same folder per row, each "
                  "damaged once (seeded); the fraction refused (`benchmarks.bench_write.catch_rates`).", "",
                  "| damage | " + " | ".join(levels) + " |", "|---|" + "---:|" * len(levels)]
        lines += [f"| {name} | " + " | ".join(f"{r[level]:.0%}" for level in levels) + " |"
                  for name, r in rates.items()]
        lines += ["", "A cut file is always refused by the walk (no end marker). Damage inside a JPEG's "
                  "entropy-coded data shows in its framing only where it forges a marker (an 0xFF byte not "
                  "followed by 0x00 or RSTn); `full` decodes every block, but libjpeg only warns about most "
                  "corrupt entropy data and PIL, the judge, then accepts the image: compare the two columns."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--num-classes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard-size", default="16MB", help="small enough that every worker gets shards")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data", default="out/bench/synthetic", help="cached synthetic image folder")
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--catch-samples", type=int, default=200, help="damaged JPEGs per kind of damage")
    parser.add_argument("--out", default=str(HERE / "results_write.md"))
    args = parser.parse_args(argv)
    args.load_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    src = Path(args.data)
    num_files, num_bytes = ensure_data(src, args.num_images, args.num_classes, args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-write-", dir=src.parent))
    try:
        with contextlib.ExitStack() as stack:
            items = contenders(src, args.shard_size, args.workers, not args.no_s3, num_bytes, stack)
            measure(items, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = catch_rates(src, args.catch_samples, args.seed) if args.catch_samples else {}
    text = report(items, num_files, num_bytes, args, rates)
    Path(args.out).write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
