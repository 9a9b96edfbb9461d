"""GCS and Azure Blob on their local emulators (fake-gcs-server, Azurite), in one interleaved run:

1. clients: ranged reads (16 MB of a 128 MB object, 4 and 8 threads in one process) through the
   async fsspec filesystem (gcsfs, adlfs: one event-loop thread) against one thread-safe synchronous
   client per process (google-cloud-storage, azure-storage-blob), as dataio/storage/s3_ranges.py does
   for S3 with botocore. This decides which one Store.read uses.
2. loaders: shardify RAW (decode=None, 2 reader threads) and WebDataset (its tar reader over an
   fsspec stream of each shard) reading the same tar shards, MB/s and time to first batch.

    python -m benchmarks.bench_clouds [--num-images 3000] [--repeats 3]

Emulators are not clouds: one local process serving from memory or disk, no network, no
per-request latency of a region; the numbers compare clients and loaders on the same server, never
the clouds themselves. Results go to benchmarks/results_clouds.md. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_OBJECT_BYTES, _RANGE_BYTES = 128 << 20, 16 << 20


def _ranged_mb_s(read: Any, threads: int) -> float:
    """MB/s of reading the object once in 16 MB ranges from `threads` threads; read(start, end) -> bytes."""
    starts = list(range(0, _OBJECT_BYTES, _RANGE_BYTES))
    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(len(b) for b in pool.map(lambda s: read(s, s + _RANGE_BYTES), starts))
    assert total == _OBJECT_BYTES
    return total / (time.perf_counter() - began) / 1e6


def client_rows(kind: str, server: Any, repeats: int) -> list[dict[str, Any]]:
    """Ranged-read MB/s of the fsspec filesystem and of the synchronous SDK client, interleaved."""
    from dataio.storage.store import Store

    bucket = server.new_bucket()
    store = Store(f"{server.scheme}://{bucket}/bench", server.options())
    store.write_bytes("big.bin", bytes(range(256)) * (_OBJECT_BYTES // 256))
    path = store.path("big.bin")
    if kind == "gcs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(project="bench", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": server.endpoint_url})
        blob = client.bucket(bucket).blob("bench/big.bin")
        sdk = lambda s, e: blob.download_as_bytes(start=s, end=e - 1, checksum=None)  # noqa: E731
    else:
        from dataio.storage.azure import client_for

        blob = client_for(server.options()).get_blob_client(bucket, "bench/big.bin")
        sdk = lambda s, e: blob.download_blob(offset=s, length=e - s).readall()  # noqa: E731
    fsspec_read = lambda s, e: store.fs.cat_file(path, start=s, end=e)  # noqa: E731
    rows = []
    for threads in (4, 8):
        got: dict[str, list[float]] = {"fsspec": [], "sdk": []}
        for _ in range(repeats):
            got["fsspec"].append(_ranged_mb_s(fsspec_read, threads))
            got["sdk"].append(_ranged_mb_s(sdk, threads))
        rows.append({"kind": kind, "threads": threads, **{k: statistics.median(v) for k, v in got.items()}})
    return rows


def loader_rows(kind: str, server: Any, local: Path, repeats: int) -> list[dict[str, Any]]:
    """shardify RAW and WebDataset over the same shards on the emulator: MB/s and seconds to first batch."""
    import webdataset as wds

    from dataio import make_loader
    from dataio.storage.store import Store

    url = f"{server.scheme}://{server.new_bucket()}/ds"
    store = Store(url, server.options())
    for p in sorted(q for q in local.rglob("*") if q.is_file()):
        store.write_bytes(p.relative_to(local).as_posix(), p.read_bytes())
    shards = [f"{url}/{name}" for name in store.list() if name.endswith(".tar")]
    total_bytes = sum(store.size(name) for name in store.list() if name.endswith(".tar"))

    def shardify() -> tuple[float, float]:
        began = time.perf_counter()
        with make_loader(url, batch_size=256, num_workers=2, decode=None, shuffle=False,
                         storage=server.options()) as loader:
            it = iter(loader)
            next(it)
            first = time.perf_counter() - began
            sum(1 for _ in it)
        return total_bytes / (time.perf_counter() - began) / 1e6, first

    def webdataset() -> tuple[float, float]:
        began = time.perf_counter()
        first, members = None, 0
        for shard in shards:  # the Store's filesystem: gcsfs's core one (see dataio/storage/gcs.py)
            with store.fs.open(store.path(shard[len(url) + 1:]), "rb") as stream:
                for _ in wds.tariterators.tar_file_expander([{"stream": io.BufferedReader(stream), "url": ""}]):
                    members += 1
                    if first is None and members >= 2 * 256:  # a .jpg and a .cls per sample: 256 samples
                        first = time.perf_counter() - began
        return total_bytes / (time.perf_counter() - began) / 1e6, float(first or 0.0)

    got: dict[str, list[tuple[float, float]]] = {"shardify RAW": [], "webdataset": []}
    for _ in range(repeats):
        got["shardify RAW"].append(shardify())
        got["webdataset"].append(webdataset())
    return [{"kind": kind, "loader": name, "mb_s": statistics.median(r[0] for r in runs),
             "first_batch_s": statistics.median(r[1] for r in runs)} for name, runs in got.items()]


def main(argv: list[str] | None = None) -> int:
    import shutil
    import subprocess
    import tempfile

    from tools.cloud_servers import AzuriteServer, GcsServer
    from tools.machine import machine_markdown

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results_clouds.md"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-clouds-"))
    subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(work / "img"), "--num-images",
                    str(args.num_images), "--num-classes", "10", "--seed", "0"], check=True)
    subprocess.run([sys.executable, "-m", "sharding.cli", "write", str(work / "img"), str(work / "ds"), "--format",
                    "tar", "--shard-size", "16MB", "--quiet"], check=True)
    clients, loaders = [], []
    for kind, server_type in (("gcs", GcsServer), ("azure", AzuriteServer)):
        with server_type() as server:
            clients += client_rows(kind, server, args.repeats)
            loaders += loader_rows(kind, server, work / "ds", args.repeats)
    shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(_report(machine_markdown(), clients, loaders, args))
    print(Path(args.out).read_text())
    return 0


def _report(machine: str, clients: list[dict[str, Any]], loaders: list[dict[str, Any]], args: Any) -> str:
    lines = ["# GCS and Azure Blob on local emulators", "",
             "Emulators are not clouds: fake-gcs-server and Azurite are one local process each, no network; the",
             "rows compare clients and loaders on the same server, not the clouds. The machine was shared with",
             "other engineers' test runs while this ran (load varies; medians of "
             f"{args.repeats} interleaved repeats).", "", machine, "",
             "## Ranged reads: fsspec filesystem vs one synchronous SDK client per process (MB/s)", "",
             "| store | threads | gcsfs / adlfs | google-cloud-storage / azure-storage-blob |", "|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['threads']} | {r['fsspec']:.0f} | {r['sdk']:.0f} |" for r in clients]
    lines += ["", f"## Loaders over the same tar shards ({args.num_images} synthetic images, 16 MB shards)", "",
              "shardify RAW: make_loader(decode=None, num_workers=2, batch 256), its first batch timed from the",
              "loader's construction. WebDataset: its tar expander over each shard opened through the same",
              "filesystem (gcsfs's core one, adlfs), one shard after another, its first 256 samples timed; no",
              "batching or collation, so its rows are an upper bound for it.", "",
              "| store | loader | MB/s | first batch (s) |", "|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['loader']} | {r['mb_s']:.0f} | {r['first_batch_s']:.2f} |" for r in loaders]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
