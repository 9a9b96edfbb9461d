"""Object storage in one interleaved run: the local SeaweedFS server's own ceiling, shardify RAW,
WebDataset, s3torchconnector's S3IterableDataset and an obstore reader (benchmarks/s3_peers.py)
reading the same tar shards over S3 with 0 and 2 workers: each one's first epoch (start-up
included), later epochs, time to first batch and CPU-seconds, at 64 MB and 256 MB shards.

    python -m benchmarks.bench_s3 [--num-images 10000] [--repeats 3] [--epochs 2] [--workers 0,2]
                                  [--sizes 64MB,256MB] [--peers webdataset,s3torchconnector,obstore]

The ceiling, measured in each round: parallel whole-object GETs (a thread pool, boto3, bodies
streamed and dropped), and curl fetching every shard whole with 1 and 2 processes (bodies to
/dev/null): what the server delivers to a client on this machine. The loaders run in fresh child
processes (benchmarks.bench_loader's runner: batch 256, persistent workers, PSS sampled); the
rows of a round run one after another, rounds interleaved, medians reported. Every shardify row
is measured in the packed form and per sample (zero-copy views, and to_list copies), by
loader_child's form runner, since webdataset delivers per-sample bytes; with workers, shardify runs
twice: its default (reader threads) and as DataLoader worker processes, the peers' own form. The
server's CPU is read around every row (per GB it served). The start-up requests
(what reaches the server before shardify's first batch) are counted through tools.delay_proxy in
a separate, untimed run. Results go to benchmarks/results_s3.md (--results). Not part of the
tests or CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARD_SIZES = ("64MB", "256MB")
# The forms a shardify RAW row is consumed in (loader_child.FORMS without "to_list, before", the
# local benchmark's measure of that change): packed, then per sample as the peers deliver it.
FORMS = ("packed", "views", "to_list")
PEERS = ("webdataset", "s3torchconnector", "obstore")


def prepare(work: Path, num_images: int, sizes: tuple[str, ...] = SHARD_SIZES) -> dict[str, Path]:
    """The synthetic image folder and its tar shards at each shard size (cached in `work`)."""
    folder = work / f"images-{num_images}"
    if not (folder / ".done").exists():
        subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(folder), "--num-images", str(num_images),
                        "--num-classes", str(min(1000, num_images)), "--seed", "0"], check=True)
        (folder / ".done").touch()
    out = {}
    for size in sizes:
        dest = work / f"shards-{num_images}-{size}"
        if not (dest / "manifest.json").exists():
            cmd = [str(Path(sys.executable).parent / "shardify"), "write", str(folder), str(dest), "--format", "tar",
                   "--shard-size", size, "--shuffle", "--seed", "0", "--overwrite", "--quiet"]
            subprocess.run(cmd, check=True)
        out[size] = dest
    return out


def upload(client: Any, bucket: str, local: Path, prefix: str) -> None:
    """Every file of a local dataset to s3://bucket/prefix/ (the same bytes, the same layout)."""
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


def ceiling(client: Any, bucket: str, keys: list[str], *, threads: int, passes: int) -> dict[str, float]:
    """Bytes/s of parallel whole-object GETs of `keys` (each `passes` times), bodies streamed and dropped."""

    def get(key: str) -> int:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        return sum(len(chunk) for chunk in body.iter_chunks(1 << 20))

    with ThreadPoolExecutor(threads) as pool:
        warm = sum(pool.map(get, keys[:threads]))  # connections opened, not timed
        start = time.perf_counter()
        total = sum(pool.map(get, keys * passes))
        seconds = time.perf_counter() - start
    return {"bytes_per_s": total / seconds, "seconds": seconds, "bytes": total, "served": warm + total}


def curl_ceiling(endpoint: str, key: str, secret: str, bucket: str, keys: list[str], *, streams: int,
                 passes: int) -> dict[str, float]:
    """Bytes/s of `streams` curl processes fetching every shard whole (`passes` times, split between them),
    bodies to /dev/null; their CPU-seconds too."""
    import resource

    urls = [f"{endpoint}/{bucket}/{k}" for k in keys] * passes
    sizes = {k: _object_size(endpoint, key, secret, bucket, k) for k in keys}
    cmd = ["curl", "-sf", "--user", f"{key}:{secret}", "--aws-sigv4", "aws:amz:us-east-1:s3"]
    if os.environ.get("AWS_CA_BUNDLE"):  # --https: the server's own certificate
        cmd += ["--cacert", os.environ["AWS_CA_BUNDLE"]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [subprocess.Popen([*cmd, *(a for u in urls[i::streams] for a in ("-o", "/dev/null", u))])
             for i in range(streams)]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("curl failed fetching the shards")
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    total = sum(sizes.values()) * passes
    return {"bytes_per_s": total / seconds, "seconds": seconds, "bytes": total, "served": total,
            "cpu_s_per_gb": cpu_s / (total / 1e9)}


def _object_size(endpoint: str, key: str, secret: str, bucket: str, name: str) -> int:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                          region_name="us-east-1", verify=os.environ.get("AWS_CA_BUNDLE"))
    return int(client.head_object(Bucket=bucket, Key=name)["ContentLength"])


def count_startup_requests(url: str, endpoint: str, env: dict[str, str], num_workers: int) -> dict[str, Any]:
    """Requests that reach the server before shardify's first batch, through a counting proxy."""
    code = (
        "import json, os, sys, dataclasses\n"
        "from tools.delay_proxy import DelayProxy\n"
        "from dataio import make_loader\n"
        "from dataio.storage.store import StorageOptions\n"
        "with DelayProxy(sys.argv[2], delay_s=0.0) as proxy:\n"
        "    opts = dataclasses.replace(StorageOptions.resolve(env=os.environ), endpoint_url=proxy.url)\n"
        "    with make_loader(sys.argv[1], batch_size=256, num_workers=int(sys.argv[3]), decode=None, tail='pad',\n"
        "                     storage=opts) as ld:\n"
        "        it = iter(ld); next(it); before = list(proxy.stats.requests)\n"
        "        for _ in it: pass\n"
        "    print(json.dumps({'before': before, 'epoch': len(proxy.stats.requests)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, url, endpoint, str(num_workers)], check=True,
                         capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT, timeout=600).stdout
    got = json.loads(out.strip().splitlines()[-1])
    lines = got["before"]
    kinds = {"manifest": sum("manifest.json" in x for x in lines), "index": sum(".idx" in x for x in lines),
             "listing": sum("list-type" in x for x in lines), "head": sum(x.startswith("HEAD") for x in lines)}
    kinds["shard and checksum reads"] = len(lines) - sum(kinds.values())
    return {"before_first_batch": len(lines), "kinds": kinds, "epoch": got["epoch"]}


CEILINGS = ("ceiling", "curl1", "curl2")  # boto3 threads; curl with 1 and 2 processes


def row_names(size: str, workers: tuple[int, ...], peers: tuple[str, ...] = ("webdataset",)) -> list[str]:
    """One round's row names for a shard size, in the order they run: the ceilings, then each loader (with
    workers, shardify twice: its default, reader threads, and DataLoader worker processes as the peers run)."""
    return [*(f"{c}/{size}" for c in CEILINGS), *(f"{kind}/{size}/{w}" for w in workers
                                                  for kind in ("shardify", *(("shardify-processes",) if w else ()),
                                                               *peers))]


def loader_specs(url: str, tars: list[str], size: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The loader rows of one shard size: shardify (every form) and each peer, at each worker count."""
    specs = {}
    for w in args.workers:
        base = {"epochs": args.epochs, "batch_size": args.batch_size, "num_workers": w, "url": url, "tars": tars,
                "task": "raw", "source": f"s3, {size} shards, {w} workers"}
        specs[f"shardify/{size}/{w}"] = {**base, "loader": "shardify", "forms": list(FORMS)}
        if w:  # the peers' own form: DataLoader worker processes, batches through shared memory
            specs[f"shardify-processes/{size}/{w}"] = {**base, "loader": "shardify", "forms": list(FORMS),
                                                       "options": {"worker_mode": "processes"}}
        for peer in args.peers:  # their batches are per sample already
            specs[f"{peer}/{size}/{w}"] = {**base, "loader": peer}
    return specs


def server_cpu_s(server: Any) -> float:
    """CPU-seconds (user + system) the S3 server's processes have used so far: what serving costs, on the
    same cores as the client here. Per GB served it bounds the rate a client can reach (results' targets)."""
    import psutil

    proc = psutil.Process(server.pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def run_ceiling(kind: str, server: Any, bucket: str, keys: list[str], bytes_per_sample: float,
                args: argparse.Namespace) -> dict[str, float]:
    """One ceiling measurement (boto3 threads, or curl with 1 or 2 processes), with the load around it."""
    load = os.getloadavg()[0]
    if kind == "ceiling":
        r = ceiling(server.client(), bucket, keys, threads=args.ceiling_threads, passes=args.epochs)
    else:
        r = curl_ceiling(server.endpoint_url, server.key, server.secret, bucket, keys, streams=int(kind[-1]),
                         passes=args.epochs)
    r["load"] = (load + os.getloadavg()[0]) / 2
    r["samples_per_s"] = r["bytes_per_s"] / bytes_per_sample
    print(f"  {kind}: {r['bytes_per_s'] / 1e6:7.0f} MB/s ({r['samples_per_s']:6.0f} samples/s)  load {r['load']:.1f}",
          flush=True)
    return r


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-images", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs per run: the first packed, then epochs - 1 per form for shardify")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts, one row each")
    parser.add_argument("--ceiling-threads", type=int, default=8)
    parser.add_argument("--sizes", default=",".join(SHARD_SIZES), help="comma-separated shard sizes")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers (of: " + ", ".join(PEERS) + ")")
    parser.add_argument("--https", action="store_true",
                        help="SeaweedFS over TLS (a self-signed certificate, AWS_CA_BUNDLE for every client); "
                             "no start-up request counts (the counting proxy speaks plain HTTP)")
    parser.add_argument("--work", default="out/bench")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results_s3.md"))
    args = parser.parse_args(argv)
    args.workers = tuple(int(w) for w in args.workers.split(","))
    args.sizes = tuple(x for x in args.sizes.split(",") if x)
    args.peers = tuple(x for x in args.peers.split(",") if x)
    if set(args.peers) - set(PEERS) or set(args.sizes) - set(SHARD_SIZES):
        parser.error(f"--peers takes {', '.join(PEERS)}; --sizes takes {', '.join(SHARD_SIZES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks.bench_loader import TORCH, run_config, tar_urls
    from tools.s3_server import S3Server

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    local = prepare(work, args.num_images, args.sizes)
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, Any] = {}
    with S3Server(data_dir=str(work / ("seaweed-s3-tls" if args.https else "seaweed-s3")), tls=args.https) as server:
        client, bucket = server.client(), server.new_bucket()
        env = {"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": server.key,
               "AWS_SECRET_ACCESS_KEY": server.secret, **({"AWS_CA_BUNDLE": server.ca_file} if args.https else {})}
        os.environ.update(env)  # tar_urls reads the manifests here; children get env explicitly
        specs, keys, info = {}, {}, {}
        for size, path in local.items():
            upload(client, bucket, path, size)
            url = f"s3://{bucket}/{size}"
            tars = tar_urls(url)
            keys[size] = [t.split(f"s3://{bucket}/", 1)[1] for t in tars]
            info[size] = _dataset_info(path, len(tars))
            specs |= loader_specs(url, tars, size, args)
            for w in args.workers if not args.https else ():
                counts[f"{size}/{w}"] = count_startup_requests(url, server.endpoint_url, env, w)
        for _ in range(args.repeats):
            for size in local:
                for name in row_names(size, args.workers, args.peers):
                    before = server_cpu_s(server)
                    if name.split("/")[0] in CEILINGS:
                        r = run_ceiling(name.split("/")[0], server, bucket, keys[size], info[size]["bytes_per_sample"],
                                        args)
                        served = r["served"]
                    else:
                        r = run_config(specs[name], env)
                        served = sum(e["samples"] for e in r["epochs"]) * info[size]["bytes_per_sample"]
                    r["server_cpu_s_per_gb"] = (server_cpu_s(server) - before) / (served / 1e9)
                    runs.setdefault(name, []).append(r)
    from benchmarks.s3_report import write_results

    write_results(Path(args.results), runs, counts, info, args, load_start, TORCH)
    return 0


def _dataset_info(path: Path, num_shards: int) -> dict[str, float]:
    """Samples, tar bytes and shards of a local dataset, from its manifest."""
    from dataio.format.manifest import read_manifest
    from dataio.storage.store import Store

    m = read_manifest(Store(str(path)))
    return {"num_samples": m.num_samples, "num_bytes": m.num_bytes, "num_shards": num_shards,
            "bytes_per_sample": m.num_bytes / max(1, m.num_samples)}


if __name__ == "__main__":
    sys.exit(main())
