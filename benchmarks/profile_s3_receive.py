"""The CPU of S3 reads into a buffer alone (no loader): s3_into.read_into of window-sized pieces, by
SO_RCVLOWAT, by reads in flight and with or without the tuner's gate (parts in flight per process),
against curl fetching the same object, on the local SeaweedFS.

    python -m benchmarks.profile_s3_receive [--shard /tmp/bench-s3/shards-3000-64MB/shards/shard-000000.tar]
        [--rounds 7] [--piece-mb 13] [--lowat 0,262144] [--in-flight 2,4,8] [--gate on,off] [--passes 4] [--hog]

Each round runs every (lowat, in flight, gate) variant once, in turn (interleaved): `in flight` threads
each read pieces of the shard (like a RAW window's pieces: 8 I/O threads by default) into a reused
buffer (gate on: adapt_parts, the tuner's per-process gate admits as many at once as it measures
worth it; off: each read's parts go at once, no gate), `passes` times over
the object; CPU is this process's user + sys (getrusage) per GB read, the rate bytes over wall time.
curl's row: one curl process fetching the object whole `passes` times to /dev/null (its CPU: the
child's); with --hog, curl again beside a busy loop (a child process) that takes one core: what sharing
the 2 cores costs a client that has them to itself otherwise. Prints per variant the median CPU-s/GB
(user / sys) and MB/s, with the load average.
Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu(who: int = resource.RUSAGE_SELF) -> tuple[float, float]:
    u = resource.getrusage(who)
    return u.ru_utime, u.ru_stime


def read_pieces(store: Any, rel: str, size: int, piece: int, in_flight: int, passes: int) -> int:
    """Every piece of the object read `passes` times, `in_flight` at once, each into its thread's buffer."""
    spans = [(a, min(size, a + piece)) for a in range(0, size, piece)] * passes
    bufs: dict[int, memoryview] = {}

    def read(span: tuple[int, int]) -> int:
        import threading

        buf = bufs.get(threading.get_ident())
        if buf is None:
            buf = bufs[threading.get_ident()] = memoryview(bytearray(piece))
        store.read_into(rel, span[0], span[1], buf, object_size=size)
        return span[1] - span[0]

    with ThreadPoolExecutor(in_flight) as pool:
        return sum(pool.map(read, spans))


def curl_once(server: Any, bucket: str, key: str, passes: int) -> tuple[float, float, int]:
    url = f"{server.endpoint_url}/{bucket}/{key}"
    cmd = ["curl", "-sf", "--user", f"{server.key}:{server.secret}", "--aws-sigv4", "aws:amz:us-east-1:s3"]
    for _ in range(passes):
        cmd += ["-o", "/dev/null", url]
    before = _cpu(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    after = _cpu(resource.RUSAGE_CHILDREN)
    return after[0] - before[0], after[1] - before[1], int(wall * 1e9)


def _per_gb(user_s: float, sys_s: float, wall_ns: int, num_bytes: int) -> tuple[float, float, float]:
    return user_s / num_bytes * 1e9, sys_s / num_bytes * 1e9, num_bytes / (wall_ns / 1e9) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shard", type=Path, default=Path("/tmp/bench-s3/shards-3000-64MB/shards/shard-000000.tar"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--piece-mb", type=float, default=13)
    ap.add_argument("--lowat", default="0,262144")
    ap.add_argument("--in-flight", default="2,4,8")
    ap.add_argument("--gate", default="off")
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--hog", action="store_true", help="also curl beside a busy loop on one core")
    args = ap.parse_args()
    from dataio.storage import s3_into, tune
    from dataio.storage.store import Store
    from tools.s3_server import S3Server

    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores")
    with S3Server() as server:
        bucket = server.new_bucket()
        server.client().upload_file(str(args.shard), bucket, "x.tar")
        size = args.shard.stat().st_size
        stores = {g: Store(f"s3://{bucket}", dataclasses.replace(server.options(), adapt_parts=g == "on"))
                  for g in args.gate.split(",")}
        for store in stores.values():
            read_pieces(store, "x.tar", size, int(args.piece_mb * 1e6), 8, 1)  # connections opened, not timed
        variants = [(int(lw), int(n), g) for lw in args.lowat.split(",") for n in args.in_flight.split(",")
                    for g in stores]
        results: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        for r in range(args.rounds):
            for lowat, n, gate in variants:
                s3_into.RCVLOWAT_BYTES = lowat
                (u0, s0), t = _cpu(), time.perf_counter()
                got = read_pieces(stores[gate], "x.tar", size, int(args.piece_mb * 1e6), n, args.passes)
                wall = time.perf_counter() - t
                u1, s1 = _cpu()
                results[f"lowat {lowat >> 10} KiB, {n} threads, gate {gate}"].append(
                    ((u1 - u0) / got * 1e9, (s1 - s0) / got * 1e9, got / wall / 1e6))
            levels = {g: tune.tuner_for(st._range_options).in_flight for g, st in stores.items() if g == "on"}
            cu, cs, ns = curl_once(server, bucket, "x.tar", args.passes)
            results["curl, 1 process, whole object"].append(_per_gb(cu, cs, ns, size * args.passes))
            if args.hog:  # what sharing the cores costs: curl again while a busy loop takes one core
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                try:
                    cu, cs, ns = curl_once(server, bucket, "x.tar", args.passes)
                finally:
                    hog.kill()
                    hog.wait()
                results["curl, 1 process, a busy loop on one core beside it"].append(
                    _per_gb(cu, cs, ns, size * args.passes))
            print(f"round {r} done (load {os.getloadavg()[0]:.2f}; the gate's level {levels or '-'})", flush=True)
        print(f"\nload average at the end {os.getloadavg()}")
        print("| what | CPU-s/GB | user | sys | MB/s |\n|---|---:|---:|---:|---:|")
        for name, rows in results.items():
            u = statistics.median(x[0] for x in rows)
            s = statistics.median(x[1] for x in rows)
            tot = statistics.median(x[0] + x[1] for x in rows)
            print(f"| {name} | {tot:.3f} | {u:.3f} | {s:.3f} | {statistics.median(x[2] for x in rows):.0f} |")


if __name__ == "__main__":
    main()
