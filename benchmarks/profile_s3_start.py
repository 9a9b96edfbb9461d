"""Where the time to the first batch from S3 goes: every storage call on the way, timed, beside webdataset.

    python -m benchmarks.profile_s3_start [--num-images 10000] [--repeats 3] [--workers 0,2] [--work out/bench]

A local SeaweedFS (tools/s3_server.py) gets the images as tar shards of 64 MB and 256 MB; each
run is a fresh process (libraries imported before the clock starts) that builds the loader and
takes one batch (RAW, batch 256). shardify's runs log each storage call (client and filesystem
creation, every Store.read: what, which bytes, how long, on which thread) on a timeline from the
loader's construction; webdataset's give its time to first batch. "shardify, before" is the code
before two changes, measured in the same run: it builds the S3 client through boto3's session
(s3_ranges now uses botocore's own), and a RAW stream starts reading its next window before it
builds the batch that opened the current one (now after). Prints per (shards, workers): the medians, and the timeline of
shardify's median run. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _instrument(events: list[dict[str, Any]], t0: list[float]) -> None:
    """Wrap the storage calls a loader's start-up makes so each appends an event."""
    from dataio.storage import s3_ranges
    from dataio.storage.store import Store

    def timed(what: str, fn: Any, describe: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            events.append({"what": what, "detail": describe(args, kwargs, out), "thread": threading.current_thread().name,
                           "start_s": start - t0[0], "seconds": time.perf_counter() - start})
            return out
        return call

    def read_detail(args: Any, kwargs: Any, out: bytes) -> str:
        rel = args[1]
        start = args[2] if len(args) > 2 else kwargs.get("start")
        return f"{rel} {'whole' if start is None else f'from {start}'}: {len(out) / 2**20:.2f} MiB"

    Store.read = timed("read", Store.read, read_detail)
    s3_ranges._make_client = timed("botocore client", s3_ranges._make_client, lambda a, k, o: "")
    fs = Store.fs
    Store.fs = property(timed("s3fs filesystem", fs.fget, lambda a, k, o: ""))  # cheap after the first


def _code_before() -> None:
    """The start-up as before: the S3 client made after importing boto3 and setting up its session;
    the next window's reads started before the batch is built (a second call after it is a no-op)."""
    from dataio.storage import s3_ranges
    from dataio.stream.raw import RawStream

    make, take = s3_ranges._make_client, RawStream._take

    def take_then_read_ahead(self: Any, num_samples: int) -> Any:
        parts = take(self, num_samples)
        self._read_ahead()
        return parts

    def before(options: Any) -> Any:
        import boto3

        boto3.session.Session()
        return make(options)

    s3_ranges._make_client = before
    RawStream._take = take_then_read_ahead


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One run: build the loader, take one batch; the seconds and (shardify) the storage calls."""
    import torch  # noqa: F401

    from benchmarks import loader_peers as peers

    events: list[dict[str, Any]] = []
    t0 = [0.0]
    if spec["loader"].startswith("shardify"):
        import dataio.loader.shard_loader  # noqa: F401 - imported before the clock, as the benchmark does

        if spec["loader"] == "shardify, before":  # the code before (for the comparison), timed below
            _code_before()
        _instrument(events, t0)
    else:
        import webdataset  # noqa: F401
    t0[0] = time.perf_counter()
    common = {"task": "raw", "batch_size": 256, "num_workers": spec["num_workers"]}
    if spec["loader"].startswith("shardify"):
        loader, _ = peers.shardify_loader(spec["url"], **common)
    else:
        loader, _ = peers.webdataset_loader(spec["tars"], **common)
    built_s = time.perf_counter() - t0[0]
    next(iter(loader))
    return {"ttfb_s": time.perf_counter() - t0[0], "built_s": built_s, "events": events}


def run(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.profile_s3_start", "--child", json.dumps(spec)],
                         cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def timeline(result: dict[str, Any]) -> list[str]:
    lines = [f"    built in {result['built_s']:.3f} s, first batch at {result['ttfb_s']:.3f} s"]
    for e in sorted(result["events"], key=lambda e: e["start_s"]):
        if e["what"] == "s3fs filesystem" and e["seconds"] < 0.001:
            continue  # the property, once the filesystem exists
        lines.append(f"    {e['start_s']:7.3f} +{e['seconds']:.3f} s  {e['thread'][:16]:<16} {e['what']} {e['detail']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--num-images", type=int, default=10_000)
    parser.add_argument("--quality", type=int, default=88, help="JPEG quality of the synthetic images (78: ~74 KB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument("--work", default="out/bench")
    args = parser.parse_args(argv)
    args.workers = tuple(int(w) for w in args.workers.split(","))
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from benchmarks.loader_data import make_images, shardify, tar_urls
    from tools.s3_server import S3Server

    folder = make_images(Path(args.work), args.num_images, args.quality)
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    with S3Server(data_dir=str(Path(args.work) / "seaweed-profile")) as server:
        env = {"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": server.key,
               "AWS_SECRET_ACCESS_KEY": server.secret}
        os.environ.update(env)
        for size in ("64MB", "256MB"):
            url = f"s3://{server.new_bucket()}/shards"
            subprocess.run([str(Path(sys.executable).parent / "shardify"), "write", str(folder), url, "--format", "tar",
                            "--shard-size", size, "--shuffle", "--seed", "0", "--quiet"], check=True, env=os.environ)
            tars = tar_urls(url)
            for workers in args.workers:
                runs: dict[str, list[dict[str, Any]]] = {"shardify": [], "shardify, before": [], "webdataset": []}
                for _ in range(args.repeats):
                    for kind in runs:
                        runs[kind].append(run({"loader": kind, "url": url, "tars": tars, "num_workers": workers}, env))
                ours = sorted(runs["shardify"], key=lambda r: r["ttfb_s"])[len(runs["shardify"]) // 2]
                seconds = {kind: ", ".join(f"{r['ttfb_s']:.3f}" for r in rs) for kind, rs in runs.items()}
                medians = {kind: statistics.median(r["ttfb_s"] for r in rs) for kind, rs in runs.items()}
                print(f"{size} shards ({len(tars)}), {workers} workers, load {os.getloadavg()[0]:.1f}: first batch, "
                      + "; ".join(f"{k} {medians[k]:.3f} s (runs {seconds[k]})" for k in runs), flush=True)
                print("\n".join(timeline(ours)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
