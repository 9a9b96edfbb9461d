"""Loader throughput in one run: shardify against the best of webdataset, MosaicML Streaming,
LitData and torchvision's ImageFolder, each reading its own format written from the same images.

    python -m benchmarks.bench_loader [--num-images 10000] [--epochs 3] [--repeats 3] [--no-s3]
    python -m benchmarks.bench_loader --mix   # only: one dataset vs the same images as a 2-source mixture

Each configuration runs in a fresh child process while the parent samples the proportional set
size (PSS) of the child's whole process tree; the peers run in benchmarks/.peers-venv (torch
2.14.1 + torchvision, built once by peers_env.py) and shardify runs both in the project's venv
and there. Reported: samples/s of the first epoch and of the later ones, MB/s of payload, time to
first batch, peak PSS, and issue 11's targets against the best peer (loader_report.py). Results
(with the machine described) go to benchmarks/results_loader.md. Not part of the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from tools.machine import package_version

ROOT = Path(__file__).resolve().parents[1]
TORCH = package_version("torch").split("+")[0]  # the project's torch, the rows' second field
PEER_TORCH = "2.14.1"  # benchmarks/.peers-venv (peers_env.PACKAGES)


# ---------------------------------------------------------------- child: one configuration
PEERS_TV = ("streaming", "litdata", "imagefolder")


def build_loader(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The loader a spec names and a function counting (samples, payload bytes) in one batch."""
    from benchmarks import loader_peers as peers

    kind, task = spec["loader"], spec["task"]
    common = {"task": task, "batch_size": spec["batch_size"], "num_workers": spec["num_workers"]}
    if kind == "shardify":
        return peers.shardify_loader(spec["url"], options=spec.get("options"), **common)
    if kind == "shardify-dali":
        return peers.shardify_loader(spec["url"], decode="dali", **common)
    if kind == "webdataset":
        return peers.webdataset_loader(spec["tars"], **common)
    if kind == "plain":
        return peers.plain_loader(spec["folder"], **common)
    if kind == "pagecache":
        return page_cache_read(spec["tars"], spec["counts"])
    if kind in PEERS_TV:
        from benchmarks import peers_tv

        source = {"streaming": spec.get("mds"), "litdata": spec.get("litdata"), "imagefolder": spec["folder"]}[kind]
        builder = getattr(peers_tv, f"{kind}_loader")
        return builder(source, **common), peers._count_raw if task == "raw" else peers._count_decoded
    raise ValueError(f"unknown loader {kind!r}")


def _import_library(kind: str) -> None:
    """Import the loader's library before the clock starts: time to first batch is the library's
    own start-up (opening the dataset, starting workers, the first batch), not Python's imports."""
    import torch  # noqa: F401

    from benchmarks import loader_peers  # noqa: F401

    # dataio's loader is a lazy attribute (`import dataio` stays light for the CLI): import what
    # `from dataio import make_loader` imports, as `import webdataset` imports its whole loader.
    loader = ["dataio", "dataio.loader.shard_loader"]
    names = {"shardify": loader, "shardify-dali": [*loader, "nvidia.dali"], "webdataset": ["webdataset"],
             "streaming": ["streaming", "torchvision"], "litdata": ["litdata", "torchvision"],
             "imagefolder": ["torchvision"]}
    for name in names.get(kind, []):
        __import__(name)


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    _import_library(spec["loader"])
    start = time.perf_counter()
    loader, count = build_loader(spec)
    max_batches = spec.get("max_batches")
    ttfb_s, epochs, cpu0 = None, [], 0.0
    for epoch in range(spec["epochs"]):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        if epoch == min(1, spec["epochs"] - 1):
            cpu0 = _tree_cpu_s()
        t0, n, nbytes = time.perf_counter(), 0, 0
        for i, batch in enumerate(loader):
            if ttfb_s is None:
                ttfb_s = time.perf_counter() - start
            k, b = count(batch)
            n, nbytes = n + k, nbytes + b
            if max_batches is not None and i + 1 >= max_batches:
                break
        epochs.append({"samples": n, "bytes": nbytes, "seconds": time.perf_counter() - t0})
    cpu_s = _tree_cpu_s() - cpu0
    steady = epochs[1:] or epochs
    seconds = sum(e["seconds"] for e in steady)
    samples = sum(e["samples"] for e in steady)
    return {
        "samples_per_s": samples / seconds,
        "first_epoch_samples_per_s": epochs[0]["samples"] / epochs[0]["seconds"],
        "mb_per_s": sum(e["bytes"] for e in steady) / seconds / 1e6,
        "ttfb_s": ttfb_s,
        "samples_per_cpu_s": samples / cpu_s if cpu_s > 0 else 0.0,
        "epochs": epochs,
    }


def _tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants (the workers)."""
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


# ---------------------------------------------------------------- parent: run, sample PSS
def _tree_pss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def _own_files(spec: dict[str, Any]) -> list[str]:
    """The local files or folders a spec's loader reads (object-store URLs left out)."""
    kind = spec["loader"]
    if kind in ("shardify", "shardify-dali"):
        urls = spec["url"] if isinstance(spec["url"], list) else [spec["url"]]
    elif kind in ("webdataset", "pagecache"):
        urls = spec["tars"]
    else:
        urls = [spec.get({"streaming": "mds", "litdata": "litdata"}.get(kind, "folder"))]
    return [u for u in urls if u and "://" not in u]


def warm_page_cache(spec: dict[str, Any]) -> None:
    """Read every file the spec's loader reads, untimed, so each run starts from a warm page cache
    (as the issue's harness measured): this VM's memory manager evicts files between runs, which
    would otherwise make a first epoch partly a disk benchmark, unequally across loaders. Twice:
    the first read puts a page on the kernel's inactive list, the second moves it to the active
    one, work the first timed epoch would otherwise pay (the plain page-cache read ran its first
    epoch at half the rate of the later ones after one warming read)."""
    buf = bytearray(8 * 2**20)
    for root in _own_files(spec) * 2:  # twice: a page's second read moves it to the kernel's active list
        files = [Path(root)] if Path(root).is_file() else sorted(p for p in Path(root).rglob("*") if p.is_file())
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def run_config(spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one configuration in a child process (its files read once before, untimed: a warm page
    cache); returns its result plus peak PSS in MiB."""
    warm_page_cache(spec)
    python, extra = sys.executable, {}
    if spec.get("python") == "peers":
        from benchmarks.peers_env import peer_env, peers_python

        python, extra = str(peers_python()), peer_env()
    cmd = [python, "-m", "benchmarks.bench_loader", "--child", json.dumps(spec)]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, env={**os.environ, **(env or {}), **extra},
                             text=True)
    peak, done = [0], threading.Event()

    def sample() -> None:
        proc = psutil.Process(child.pid)
        while not done.wait(0.25):
            try:
                peak[0] = max(peak[0], _tree_pss(proc))
            except psutil.NoSuchProcess:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    load_before = os.getloadavg()[0]
    sampler.start()
    out, _ = child.communicate(timeout=3600)
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise RuntimeError(f"{spec['loader']}/{spec['task']} failed with exit code {child.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_pss_mib"] = peak[0] / 2**20
    # The 1-minute load average around the run (the machine is shared): before and after.
    result["load"] = (load_before + os.getloadavg()[0]) / 2
    label = f"{spec['loader']:<12} {spec.get('python', 'project'):<8} {spec['task']:<6} {spec.get('source', 'local'):<10}"
    print(f"  {label} {result['first_epoch_samples_per_s']:7.0f} then {result['samples_per_s']:7.0f} samples/s  "
          f"{result['mb_per_s']:8.1f} MB/s  "
          f"{result['samples_per_cpu_s']:7.0f}/CPU-s  ttfb {result['ttfb_s']:5.2f} s  "
          f"PSS {result['peak_pss_mib']:6.0f} MiB  load {result['load']:.1f}", flush=True)
    return result


KEYS = ("samples_per_s", "first_epoch_samples_per_s", "mb_per_s", "ttfb_s", "peak_pss_mib", "samples_per_cpu_s",
        "load")


def interleaved(specs: dict[str, tuple[dict[str, Any], int]], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run each named (spec, repeats) in rounds, one run of each per round, so load drifts hit all
    alike; returns the per-key medians of each name's runs."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
    for round_ in range(max(r for _, r in specs.values())):
        for name, (spec, repeats) in specs.items():
            if round_ < repeats:
                runs[name].append(run_config(spec, env))
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        out[name] = {k: statistics.median(r[k] for r in rs) for k in KEYS}
        out[name]["runs"] = [round(r["samples_per_s"]) for r in rs]
        m = out[name]
        print(f"{name:<32} median of {len(rs)}: {m['samples_per_s']:9.0f} samples/s  {m['mb_per_s']:8.1f} MB/s  "
              f"ttfb {m['ttfb_s']:5.2f} s  peak PSS {m['peak_pss_mib']:7.0f} MiB", flush=True)
    return out


# ---------------------------------------------------------------- data preparation
def _shardify(src: Path, dest: str, env: dict[str, str] | None = None) -> None:
    shardify = str(Path(sys.executable).parent / "shardify")
    cmd = [shardify, "write", str(src), dest, "--format", "tar", "--shard-size", "64MB",
           "--shuffle", "--seed", "0", "--overwrite", "--quiet"]
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def prepare(work: Path, num_images: int) -> dict[str, Any]:
    """Synthetic ImageNet-like folder, its 4x twin (same bytes, new keys), and tar shards of both."""
    folder = work / f"images-{num_images}"
    if not (folder / ".done").exists():
        subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(folder), "--num-images",
                        str(num_images), "--num-classes", str(min(1000, num_images)), "--seed", "0"], check=True)
        (folder / ".done").touch()
    big = work / f"images-{num_images}-x4"
    if not (big / ".copied").exists():  # copies: the folder source reads a hard-linked file once
        for f in folder.rglob("*.jpg"):
            for copy in range(4):
                target = big / f.parent.name / f"{f.stem}_c{copy}{f.suffix}"
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists() and target.stat().st_nlink > 1:
                    target.unlink()
                if not target.exists():
                    shutil.copyfile(f, target)
        shutil.rmtree(work / f"shards-{num_images}-x4", ignore_errors=True)  # written from the links: again
        (big / ".copied").touch()
    shards, big_shards = work / f"shards-{num_images}", work / f"shards-{num_images}-x4"
    for src, dest in ((folder, shards), (big, big_shards)):
        if not (dest / "manifest.json").exists():
            _shardify(src, str(dest))
    return {"folder": str(folder), "shards": str(shards), "big_shards": str(big_shards)}


def prepare_halves(work: Path, folder: str) -> list[str]:
    """The same images as two datasets (the first half of the class folders, then the rest), for
    the mixture row: a 1:1 mixture of them reads exactly the bytes of the one-dataset row."""
    classes = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    urls = []
    for i, part in enumerate((classes[: len(classes) // 2], classes[len(classes) // 2:])):
        half = work / f"{Path(folder).name}-half{i}"
        if not (half / ".done").exists():
            for cls in part:
                for f in cls.glob("*.jpg"):
                    target = half / cls.name / f.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if not target.exists():
                        os.link(f, target)
            (half / ".done").touch()
        dest = work / f"shards-{Path(folder).name}-half{i}"
        if not (dest / "manifest.json").exists():
            _shardify(half, str(dest))
        urls.append(str(dest))
    return urls


def mix_specs(data: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], int]]:
    """RAW, one dataset vs the same images as a 1:1 mixture of two (plan/mix.py): the cost of mixing."""
    base = {"epochs": args.epochs, "batch_size": args.batch_size, "num_workers": args.num_workers,
            "loader": "shardify", "task": "raw"}
    return {
        f"shardify/{TORCH}/raw/local": ({**base, "url": data["shards"]}, args.repeats),
        f"shardify/{TORCH}/raw/local, 2-source mix": (
            {**base, "url": data["halves"], "options": {"weights": [1, 1]}, "source": "2-source mix"}, args.repeats),
    }


def tar_urls(prefix: str) -> list[str]:
    from dataio.format.manifest import read_manifest
    from dataio.storage.store import StorageOptions, Store

    store = Store(prefix, StorageOptions.resolve(env=os.environ))
    return [f"{prefix.rstrip('/')}/{p}" for p in read_manifest(store).shard_paths]


def shard_counts(prefix: str) -> list[int]:
    from dataio.format.manifest import read_manifest
    from dataio.storage.store import StorageOptions, Store

    return list(read_manifest(Store(prefix, StorageOptions.resolve(env=os.environ))).shard_num_samples)


# ---------------------------------------------------------------- the run
def page_cache_read(urls: list[str], counts: list[int]) -> tuple[Any, Any]:
    """The machine's ceiling for RAW: every shard read front to back into one reused 16 MiB buffer."""

    def batches() -> Any:
        buf = bytearray(16 * 2**20)
        for url, n in zip(urls, counts):
            with open(url, "rb", buffering=0) as f:
                total = 0
                while (got := f.readinto(buf)) > 0:
                    total += got
            yield n, total

    class Reads:
        def __iter__(self) -> Any:
            return batches()

    return Reads(), lambda b: b


def local_specs(data: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], int]]:
    """Every local row: name "loader/torch/task/variant" -> (spec, repeats)."""
    base = {"epochs": args.epochs, "batch_size": args.batch_size, "num_workers": args.num_workers}
    local = {**base, "url": data["shards"], "tars": tar_urls(data["shards"]), "folder": data["folder"],
             "mds": data.get("mds"), "litdata": data.get("litdata")}
    main_r, peer_r = args.repeats, min(args.peer_repeats, args.repeats)
    peers = ["webdataset", *([] if args.no_peers_venv else ["imagefolder", "streaming", "litdata"])]
    specs: dict[str, tuple[dict[str, Any], int]] = {}
    for task in ("raw",) if args.raw_only else ("raw", "decode"):
        epochs = args.epochs if task == "raw" else args.decode_epochs
        repeats = main_r if task == "raw" else peer_r
        specs[f"shardify/{TORCH}/{task}/local"] = ({**local, "loader": "shardify", "task": task, "epochs": epochs},
                                                   repeats)
        for kind in ([] if args.no_peers_venv else ["shardify"]) + peers:
            spec = {**local, "loader": kind, "task": task, "epochs": epochs}
            if not args.no_peers_venv:
                spec["python"] = "peers"
            specs[f"{kind}/{PEER_TORCH if 'python' in spec else TORCH}/{task}/local"] = (spec, repeats)
    reuse = {"options": {"reuse_buffers": True}}
    # The DataLoader worker processes RAW ran in before reader threads (worker_mode="processes").
    specs[f"shardify/{TORCH}/raw/local, processes"] = ({**local, "options": {"worker_mode": "processes"},
                                                       "loader": "shardify", "task": "raw",
                                                       "source": "local, processes"}, main_r)
    specs[f"shardify/{TORCH}/raw/local, reuse_buffers"] = ({**local, **reuse, "loader": "shardify", "task": "raw",
                                                            "source": "local, reuse_buffers"}, main_r)
    w0 = {**local, "task": "raw", "num_workers": 0, "source": "local, 0 workers"}
    specs[f"shardify/{TORCH}/raw/local, 0 workers"] = ({**w0, "loader": "shardify"}, main_r)
    specs[f"shardify/{TORCH}/raw/local, 0 workers, reuse_buffers"] = (
        {**w0, **reuse, "loader": "shardify", "source": "local, 0 workers, reuse_buffers"}, main_r)
    if not args.no_peers_venv:
        specs[f"imagefolder/{PEER_TORCH}/raw/local, 0 workers"] = ({**w0, "loader": "imagefolder",
                                                                     "python": "peers"}, main_r)
    if not args.raw_only:
        specs[f"shardify/{TORCH}/decode/local, batch 32"] = (
            {**local, "loader": "shardify", "task": "decode", "batch_size": 32, "epochs": 1, "max_batches": 3,
             "source": "local, batch 32"}, main_r)
    big = {**base, "url": data["big_shards"], "tars": tar_urls(data["big_shards"]), "source": "local x4"}
    specs[f"shardify/{TORCH}/raw/local x4"] = ({**big, "loader": "shardify", "task": "raw"}, peer_r)
    specs["page cache/-/raw/local"] = ({**local, "loader": "pagecache", "task": "raw",
                                        "counts": shard_counts(data["shards"])}, main_r)
    if "halves" in data:
        specs.update(mix_specs(data, args))
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--num-images", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--decode-epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-repeats", type=int, default=1, help="repeats of the DECODE rows and the x4 row")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--work", default="out/bench", help="where data is generated and cached")
    parser.add_argument("--no-s3", action="store_true", help="skip the runs against a local SeaweedFS")
    parser.add_argument("--raw-only", action="store_true", help="only the RAW rows (no DECODE, no batch-32 row)")
    parser.add_argument("--no-peers-venv", action="store_true",
                        help="no Streaming/LitData/ImageFolder rows (they need benchmarks/.peers-venv, built once)")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results_loader.md"))
    parser.add_argument("--only", default="",
                        help="while iterating: only the rows whose name (loader/torch/task/variant) contains one "
                             "of these comma-separated strings; the targets table then lacks the others")
    parser.add_argument("--mix", action="store_true",
                        help="only the mixing rows (RAW: one dataset vs a 2-source mixture), to results_mix.md")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.mix:
        return run_mix(work, args)
    data = prepare(work, args.num_images)
    data["halves"] = prepare_halves(work, data["folder"])
    if not args.no_peers_venv:
        from benchmarks.peers_env import prepare_peer_formats

        data |= prepare_peer_formats(Path(data["folder"]), work)
    load_start = os.getloadavg()
    specs = local_specs(data, args)
    if args.only:
        specs = {k: v for k, v in specs.items() if any(part in k for part in args.only.split(","))}
    res = interleaved(specs)
    if not args.no_s3:
        base = {"epochs": args.epochs, "batch_size": args.batch_size, "num_workers": args.num_workers}
        res |= run_s3(work, data, base, args.repeats, min(args.peer_repeats, args.repeats))
    from benchmarks.loader_report import write_results

    write_results(Path(args.results), res, args, load_start)
    return 0


def run_s3(work: Path, data: dict[str, Any], base: dict[str, Any], repeats: int, peer_repeats: int) -> dict[str, Any]:
    """The same RAW task from a local SeaweedFS, then through a proxy adding 50 ms per request."""
    from tools.delay_proxy import DelayProxy
    from tools.s3_server import S3Server

    res: dict[str, Any] = {}
    with S3Server(data_dir=str(work / "seaweed")) as server:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/shards"
        env = {"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": server.key,
               "AWS_SECRET_ACCESS_KEY": server.secret}
        _shardify(Path(data["folder"]), url, env)
        os.environ.update(env)  # for tar_urls here; children get env explicitly
        spec = {**base, "url": url, "tars": tar_urls(url), "task": "raw", "source": "s3"}
        res |= interleaved({f"{kind}/{TORCH}/raw/s3": ({**spec, "loader": kind}, repeats)
                            for kind in ("shardify", "webdataset")}, env)
        with DelayProxy(server.endpoint_url, delay_s=0.05) as proxy:
            slow = {**env, "AWS_ENDPOINT_URL": proxy.url}
            res |= interleaved({
                f"shardify/{TORCH}/raw/s3+50ms": ({**spec, "loader": "shardify", "source": "s3+50ms"}, repeats),
                f"webdataset/{TORCH}/raw/s3+50ms": ({**spec, "loader": "webdataset", "source": "s3+50ms"},
                                                    peer_repeats),
            }, slow)
    return res



def run_mix(work: Path, args: argparse.Namespace) -> int:
    """The mixing rows alone (no peers, no x4 data): results_mix.md."""
    folder = work / f"images-{args.num_images}"
    if not (folder / ".done").exists():
        subprocess.run([sys.executable, "-m", "tools.make_synthetic", str(folder), "--num-images",
                        str(args.num_images), "--num-classes", str(min(1000, args.num_images)), "--seed", "0"],
                       check=True)
        (folder / ".done").touch()
    shards = work / f"shards-{args.num_images}"
    if not (shards / "manifest.json").exists():
        _shardify(folder, str(shards))
    data = {"shards": str(shards), "halves": prepare_halves(work, str(folder))}
    load_start = os.getloadavg()
    res = interleaved(mix_specs(data, args))
    from benchmarks.loader_report import write_mix_results

    write_mix_results(ROOT / "benchmarks" / "results_mix.md", res, args, load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())

