"""What a ranged GET costs the client and the server, by range size: the server's CPU is on the same
cores here, so it bounds what any client reaches (results_s3.md's CPU bound).

    python -m benchmarks.profile_s3_ranges [--shards /tmp/bench-s3/shards-10000-64MB] [--rounds 3]

A local SeaweedFS (tools/s3_server.py) gets the shards; every round reads every shard once per variant,
one GET at a time into a reused buffer (s3_into.get_into: the loader's receive), cut as the variant says:
whole objects, ranges of 16, 8 or 4 MiB from offset 0, 8 MiB ranges starting 4 MiB in (not aligned to
the upload's 8 MiB parts), and 13 MB ranges (a RAW window's pieces here). Prints per variant the median
CPU-seconds per GB of the server's process (psutil) and of this process, with each round's server figure.
Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1 << 20


def cut(size: int, part: int, first: int = 0) -> list[tuple[int, int]]:
    """[0, size) cut at first, first + part, ... (first 0: at part, 2 part, ...)."""
    cuts = [0, *range(first or part, size, part), size]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


VARIANTS: dict[str, Callable[[int], list[tuple[int, int]]]] = {
    "whole objects": lambda s: [(0, s)],
    "16 MiB ranges": lambda s: cut(s, 16 * MIB),
    "13 MB ranges": lambda s: cut(s, 13_000_000),
    "8 MiB ranges": lambda s: cut(s, 8 * MIB),
    "8 MiB ranges, shifted 4 MiB": lambda s: cut(s, 8 * MIB, 4 * MIB),
    "4 MiB ranges": lambda s: cut(s, 4 * MIB),
}


def main() -> None:
    import psutil

    from benchmarks.bench_s3 import server_cpu_s, upload
    from tools.s3_server import S3Server

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=Path, default=Path("/tmp/bench-s3/shards-10000-64MB"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with S3Server() as server:
        client, bucket = server.client(), server.new_bucket()
        os.environ.update({"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": server.key,
                           "AWS_SECRET_ACCESS_KEY": server.secret})
        upload(client, bucket, args.shards, "d")
        from dataio.storage import s3_into
        from dataio.storage.store import StorageOptions

        options = StorageOptions.resolve(env=os.environ)
        listed = client.list_objects_v2(Bucket=bucket, Prefix="d/")["Contents"]
        sizes = {o["Key"]: o["Size"] for o in listed if o["Key"].endswith(".tar")}
        dest = memoryview(bytearray(max(sizes.values())))
        me = psutil.Process()
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, spans in VARIANTS.items():
                server0, mine0, done, requests = server_cpu_s(server), sum(me.cpu_times()[:2]), 0, 0
                for key, size in sizes.items():
                    for a, b in spans(size):
                        s3_into.get_into(options, f"{bucket}/{key}", a, b, dest[a:b])
                        done, requests = done + b - a, requests + 1
                gb = done / 1e9
                results[name].append(((server_cpu_s(server) - server0) / gb, (sum(me.cpu_times()[:2]) - mine0) / gb,
                                      requests))
        print(f"{len(sizes)} objects, {sum(sizes.values()) / 1e9:.2f} GB, {args.rounds} rounds, load "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print("| GETs | per GB | server CPU-s/GB | client CPU-s/GB | server, each round |\n|---|---:|---:|---:|---|")
        for name, rs in results.items():
            per_gb = rs[0][2] / (sum(sizes.values()) / 1e9)
            print(f"| {name} | {per_gb:.0f} | {statistics.median(r[0] for r in rs):.2f} | "
                  f"{statistics.median(r[1] for r in rs):.2f} | {', '.join(f'{r[0]:.2f}' for r in rs)} |")


if __name__ == "__main__":
    main()
