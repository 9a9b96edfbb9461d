"""Where the CPU of a RAW epoch from S3 goes, per stage and per thread (main, I/O and part threads, workers).

    python -m benchmarks.profile_s3_cpu [--shards /tmp/bench-s3/shards-3000-64MB] [--workers 0,2] [--epochs 3]

A local SeaweedFS (tools/s3_server.py) gets a tar dataset; a loader reads RAW epochs (decode=None, batch
256) in this process. Each stage's functions are wrapped so every call adds the CPU its own thread spent
(getrusage(RUSAGE_THREAD): user, sys and minor page faults), whatever thread runs it: the part threads
that receive HTTP bodies are seen, which cProfile (main thread only) is not. Worker processes (forked,
so they inherit the wrapping) write their totals to a file after every batch; the parent sums them.
Prints per epoch: CPU-s per 1,000 samples of the whole process tree, and per stage CPU-s per 1,000
samples, user/sys and faults. Stages nest (a part's "receive" is inside its "part"); "rest" is the tree's
CPU outside the top-level stages (the loader's own bookkeeping, IPC of batches, the interpreter).
With --variant a,b (names in VARIANTS, "x+y" for both), each takes a round in turn: an A/B in one run.
Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# stage -> (module, qualified name); "outer/inner": inner runs inside outer, in its thread. A hedged part's
# GETs run in the hedger's threads, not the part's: they are stages of their own.
STAGES = {
    "part (its thread: retry, hedge, wait)": ("dataio.storage.s3_into", "_part"),
    "GET receive (recv_into the window)": ("dataio.storage.s3_into", "_receive"),
    "GET request (sign, send, headers)": ("dataio.storage.s3_into", "_get"),
    "new batch storage (pool miss)": ("dataio.stream.slabs", "huge_pages"),
    "window read (I/O thread: start parts, wait)": ("dataio.stream.raw", "RawStream._read"),
    "window read/checksums (per-sample sums)": ("dataio.readers.tar", "TarReader.verified"),
    "window layout (index columns)": ("dataio.stream.raw", "RawStream._layout"),
    "index fetch + parse": ("dataio.readers.tar", "TarReader._load_index"),
    "batch build (main thread or worker)": ("dataio.stream.raw_batch", "BatchBuilder.build"),
    "batch build/gather (copy into PackedBytes)": ("dataio.stream.raw_batch", "_Items.gather"),
    "carry (batch straddling windows)": ("dataio.stream.raw_batch", "CarryArena.carry"),
}
_totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # user, sys, faults, calls
_lock = threading.Lock()
_dump_dir: list[str] = []


def _thread_usage() -> tuple[float, float, int]:
    u = resource.getrusage(resource.RUSAGE_THREAD)
    return u.ru_utime, u.ru_stime, u.ru_minflt


def _wrap(stage: str, fn: Any) -> Any:
    depth = threading.local()

    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(depth, "n", 0):  # a recursive or retried call inside one already counted
            return fn(*args, **kwargs)
        depth.n = 1
        u0, s0, f0 = _thread_usage()
        try:
            return fn(*args, **kwargs)
        finally:
            depth.n = 0
            u1, s1, f1 = _thread_usage()
            with _lock:
                t = _totals[stage]
                t[0] += u1 - u0
                t[1] += s1 - s0
                t[2] += f1 - f0
                t[3] += 1
            if stage.startswith("batch build (") and _dump_dir and os.getpid() != _PARENT:
                _dump()
    return call


_PARENT = os.getpid()


def _dump() -> None:
    """This worker's totals (and its whole CPU) to its file, replaced atomically."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    with _lock:
        data = {"stages": dict(_totals), "cpu": [me.ru_utime, me.ru_stime, me.ru_minflt]}
    path = Path(_dump_dir[0]) / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def instrument(dump_dir: str) -> None:
    import importlib

    _dump_dir.append(dump_dir)
    for stage, (module, name) in STAGES.items():
        mod = importlib.import_module(module)
        owner, _, attr = name.rpartition(".")
        holder = getattr(mod, owner) if owner else mod
        setattr(holder, attr, _wrap(stage, getattr(holder, attr)))


def snapshot(dump_dir: str) -> dict[str, Any]:
    """Cumulative totals of this process and its workers: stages, and the tree's user/sys/faults."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    stages: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    with _lock:
        for k, v in _totals.items():
            stages[k] = list(v)
    cpu = [me.ru_utime, me.ru_stime, me.ru_minflt]
    for f in Path(dump_dir).glob("*.json"):
        data = json.loads(f.read_text())
        for k, v in data["stages"].items():
            stages[k] = [a + b for a, b in zip(stages[k], v)]
        cpu = [a + b for a, b in zip(cpu, data["cpu"])]
    return {"stages": dict(stages), "cpu": cpu}


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    zero = [0.0, 0.0, 0.0, 0.0]
    return {"stages": {k: [y - x for x, y in zip(a["stages"].get(k, zero), v)] for k, v in b["stages"].items()},
            "cpu": [y - x for x, y in zip(a["cpu"], b["cpu"])]}


def table(d: dict[str, Any], n: int) -> list[str]:
    per = 1000 / n
    user, sys_, faults = d["cpu"]
    rows = [f"| whole process tree | {(user + sys_) * per:.3f} | {user * per:.3f} | {sys_ * per:.3f} | "
            f"{faults * per:.0f} | |"]
    top = 0.0
    for stage in STAGES:
        u, s, f, c = d["stages"].get(stage, [0.0, 0.0, 0.0, 0.0])
        if "/" not in stage:
            top += u + s
        rows.append(f"| {stage.replace('/', ' > ')} | {(u + s) * per:.3f} | {u * per:.3f} | {s * per:.3f} | "
                    f"{f * per:.0f} | {int(c)} |")
    rows.append(f"| rest (outside the stages above) | {(user + sys_ - top) * per:.3f} | | | | |")
    return rows


def run(shards: Path, workers: int, epochs: int, variants: list[str]) -> None:
    from benchmarks.bench_s3 import upload
    from tools.s3_server import S3Server

    with S3Server() as server, tempfile.TemporaryDirectory() as dump_dir:
        client, bucket = server.client(), server.new_bucket()
        os.environ.update({"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": server.key,
                           "AWS_SECRET_ACCESS_KEY": server.secret})
        upload(client, bucket, shards, "d")
        instrument(dump_dir)
        from dataio import make_loader

        results: dict[str, list[float]] = defaultdict(list)
        for e in range(epochs):
            for variant in variants:
                extra: dict[str, Any] = {}
                for name in variant.split("+"):  # "a+b": both
                    extra.update(VARIANTS[name](server) or {})
                loader = make_loader(f"s3://{bucket}/d", batch_size=256, num_workers=workers, decode=None,
                                     rank=0, world_size=1, **extra)
                loader.set_epoch(e)
                before, t = snapshot(dump_dir), time.perf_counter()
                main0 = sum(_thread_usage()[:2])
                n = sum(len(b["__key__"]) for b in loader)
                wall = time.perf_counter() - t
                main_s = sum(_thread_usage()[:2]) - main0
                loader.close()
                time.sleep(0.3)  # workers' last dumps
                d = diff(before, snapshot(dump_dir))
                cpu = (d["cpu"][0] + d["cpu"][1]) / n * 1000
                results[variant].append(cpu)
                print(f"\n### workers {workers}, round {e}, {variant}: {n} samples, {wall:.2f} s, {n / wall:.0f}/s, "
                      f"{cpu:.3f} CPU-s/1000 (load {os.getloadavg()[0]:.2f})")
                print("| stage | CPU-s/1000 | user | sys | faults/1000 | calls |\n|---|---|---|---|---|---|")
                print("\n".join(table(d, n)))
                print(f"| main thread (all of it) | {main_s / n * 1000:.3f} | | | | |", flush=True)
                print(f"this process's parts in flight (the tuner's gate): {_gate_levels()}")
        for variant, v in results.items():
            print(f"workers {workers} {variant}: median CPU-s/1000 {statistics.median(v):.3f} of {v}")


def _gate_levels() -> dict[str, int]:
    """Each endpoint's tuned parts in flight in this process (with workers: the parent's, not theirs)."""
    from dataio.storage import tune

    return {f"{key[1]} cap {key[3]}": t.in_flight for key, t in tune._TUNERS.items() if key[0] == os.getpid()}


_SAVED: dict[str, Any] = {}


def _threads_per_read(server: Any) -> None:
    """The code before: a new thread pool for every read's parts and every hedged part's requests."""
    from concurrent.futures import ThreadPoolExecutor

    from dataio.storage import hedge, s3_into

    _SAVED.setdefault("in_parallel", s3_into._in_parallel)
    _SAVED.setdefault("threads", hedge.threads)

    def in_parallel(worker: Any, helpers: int) -> None:
        if helpers <= 0:
            return worker()
        with ThreadPoolExecutor(helpers, thread_name_prefix=s3_into.THREAD_NAME_PREFIX) as pool:
            for _ in range(helpers):
                pool.submit(worker)
            worker()

    class PerCall:
        ElasticPool = object

        @staticmethod
        def pool(name: str) -> Any:
            return ThreadPoolExecutor(3, thread_name_prefix=name)  # dropped unjoined, as shutdown(wait=False)

    s3_into._in_parallel, hedge.threads = in_parallel, PerCall


def _threads_kept(server: Any) -> None:
    from dataio.storage import hedge, s3_into

    s3_into._in_parallel = _SAVED.get("in_parallel", s3_into._in_parallel)
    hedge.threads = _SAVED.get("threads", hedge.threads)


def _parts_of(size: int) -> Any:
    def options(server: Any) -> dict[str, Any]:
        import dataclasses

        return {"storage": dataclasses.replace(server.options(), part_bytes=size)}
    return options


def _adapt(on: bool) -> Any:
    def options(server: Any) -> dict[str, Any]:
        import dataclasses

        return {"storage": dataclasses.replace(server.options(), adapt_parts=on)}
    return options


def _low_water_of(size: int) -> Any:
    def variant(server: Any) -> None:
        from dataio.storage import s3_into

        s3_into.RCVLOWAT_BYTES = size  # 0: woken per packet, as before
    return variant


def _in_flight(n: int) -> Any:
    return lambda server: {"max_in_flight": n}


VARIANTS: dict[str, Any] = {"now": lambda server: None, "parts-16MiB": _parts_of(16 << 20),
                            "parts-8MiB": _parts_of(8 << 20), "reuse-buffers": lambda server: {"reuse_buffers": True},
                            "threads-per-read": _threads_per_read, "threads-kept": _threads_kept,
                            "lowat-off": _low_water_of(0), "lowat-64K": _low_water_of(64 << 10),
                            "lowat-256K": _low_water_of(256 << 10), "lowat-1M": _low_water_of(1 << 20),
                            "inflight-2": _in_flight(2), "inflight-4": _in_flight(4), "inflight-8": _in_flight(8),
                            "gate": _adapt(True), "no-gate": _adapt(False)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=Path, default=Path("/tmp/bench-s3/shards-3000-64MB"))
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--variant", default="now")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores")
    run(args.shards, args.workers, args.epochs, args.variant.split(","))


if __name__ == "__main__":
    main()
