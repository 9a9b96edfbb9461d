"""Loader throughput in one run: shardify against the best of webdataset, MosaicML Streaming,
LitData and torchvision's ImageFolder, each reading its own format written from the same images.

    python -m benchmarks.bench_loader [--num-images 10000] [--epochs 3] [--repeats 3] [--no-s3]
    python -m benchmarks.bench_loader --mix   # only: one dataset vs the same images as a 2-source mixture

Each configuration runs in a fresh child process while the parent samples the proportional set
size (PSS) of the child's whole process tree; the peers run in benchmarks/.peers-venv (torch
2.14.1 + torchvision, built once by peers_env.py) and shardify runs both in the project's venv
and there (without that venv, `--no-peers-venv`, a plain file-per-sample DataLoader stands in for
ImageFolder). Reported: samples/s of the first epoch and of the later ones, MB/s of payload, time to
first batch, peak PSS, and the targets against the best peer (loader_report.py). Every shardify RAW
row is measured in two forms, packed and per sample (zero-copy views, and to_list copies:
loader_child.py), since the peers deliver per-sample bytes. Results (with the machine described) go
to benchmarks/results_loader.md. Not part of the tests or CI. The child: loader_child.py; the data:
loader_data.py.
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

import psutil

from benchmarks.loader_child import FORMS, run_child
from benchmarks.loader_data import (  # noqa: F401 - tar_urls, shardify: also bench_first's, bench_s3's, bench_mix's
    DEFAULT_QUALITY,
    make_images,
    prepare,
    prepare_halves,
    shard_counts,
    shardify,
    tar_urls,
)
from tools.machine import package_version

ROOT = Path(__file__).resolve().parents[1]
TORCH = package_version("torch").split("+")[0]  # the project's torch, the rows' second field
PEER_TORCH = "2.14.1"  # benchmarks/.peers-venv (peers_env.PACKAGES)


# ---------------------------------------------------------------- parent: run, sample PSS
def _tree_pss(proc: psutil.Process) -> list[int]:
    """PSS of the process and each of its descendants (the workers), bytes."""
    out = []
    for p in [proc, *proc.children(recursive=True)]:
        try:
            out.append(p.memory_full_info().pss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


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
    peak, parts, done = [0], [[0]], threading.Event()

    def sample() -> None:
        proc = psutil.Process(child.pid)
        while not done.wait(0.25):
            try:
                now = _tree_pss(proc)
            except psutil.NoSuchProcess:
                return
            if sum(now) > peak[0]:
                peak[0], parts[0] = sum(now), now

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
    result["peak_pss_parts_mib"] = [round(p / 2**20) for p in parts[0]]  # the process, then its children
    # The 1-minute load average around the run (the machine is shared): before and after.
    result["load"] = (load_before + os.getloadavg()[0]) / 2
    label = f"{spec['loader']:<12} {spec.get('python', 'project'):<8} {spec['task']:<6} {spec.get('source', 'local'):<10}"
    print(f"  {label} {result['first_epoch_samples_per_s']:7.0f} then {result['samples_per_s']:7.0f} samples/s  "
          f"{result['mb_per_s']:8.1f} MB/s  "
          f"{result['samples_per_cpu_s']:7.0f}/CPU-s  ttfb {result['ttfb_s']:5.2f} s  "
          f"PSS {result['peak_pss_mib']:6.0f} MiB {result['peak_pss_parts_mib']}  load {result['load']:.1f}",
          flush=True)
    return result


KEYS = ("samples_per_s", "first_epoch_samples_per_s", "mb_per_s", "ttfb_s", "peak_pss_mib", "samples_per_cpu_s",
        "load", *(f"samples_per_s {form}" for form in FORMS[1:]))


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
        out[name] = {k: statistics.median(r[k] for r in rs) for k in KEYS if k in rs[0]}
        out[name]["runs"] = [round(r["samples_per_s"]) for r in rs]
        m = out[name]
        print(f"{name:<32} median of {len(rs)}: {m['samples_per_s']:9.0f} samples/s  {m['mb_per_s']:8.1f} MB/s  "
              f"ttfb {m['ttfb_s']:5.2f} s  peak PSS {m['peak_pss_mib']:7.0f} MiB", flush=True)
    return out


def mix_specs(data: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], int]]:
    """RAW, one dataset vs the same images as a 1:1 mixture of two (plan/mix.py): the cost of mixing."""
    base = {"epochs": args.epochs, "batch_size": args.batch_size, "num_workers": args.num_workers,
            "loader": "shardify", "task": "raw"}
    return {
        f"shardify/{TORCH}/raw/local": ({**base, "url": data["shards"]}, args.repeats),
        f"shardify/{TORCH}/raw/local, 2-source mix": (
            {**base, "url": data["halves"], "options": {"weights": [1, 1], "label_space": "union"},
             "source": "2-source mix"}, args.repeats),
    }


# ---------------------------------------------------------------- the run
def local_specs(data: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[dict[str, Any], int]]:
    """Every local row: name "loader/torch/task/variant" -> (spec, repeats)."""
    base = {"epochs": args.epochs, "batch_size": args.batch_size, "num_workers": args.num_workers}
    local = {**base, "url": data["shards"], "tars": tar_urls(data["shards"]), "folder": data["folder"],
             "mds": data.get("mds"), "litdata": data.get("litdata")}
    main_r, peer_r = args.repeats, min(args.peer_repeats, args.repeats)
    # Without the peers' venv, "plain" (ImageFolder's shape: a file per sample, a DataLoader) stands in.
    peers = ["webdataset", *(["plain"] if args.no_peers_venv else ["imagefolder", "streaming", "litdata"])]
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
    else:
        specs[f"plain/{TORCH}/raw/local, 0 workers"] = ({**w0, "loader": "plain"}, main_r)
    if not args.raw_only:
        specs[f"shardify/{TORCH}/decode/local, batch 32"] = (
            {**local, "loader": "shardify", "task": "decode", "batch_size": 32, "epochs": 1, "max_batches": 3,
             "source": "local, batch 32"}, main_r)
    if "big_shards" in data:
        big = {**base, "url": data["big_shards"], "tars": tar_urls(data["big_shards"]), "source": "local x4"}
        specs[f"shardify/{TORCH}/raw/local x4"] = ({**big, "loader": "shardify", "task": "raw"}, peer_r)
    specs["page cache/-/raw/local"] = ({**local, "loader": "pagecache", "task": "raw",
                                        "counts": shard_counts(data["shards"])}, main_r)
    if "halves" in data:
        specs.update(mix_specs(data, args))
    return with_forms(specs)


def with_forms(specs: dict[str, tuple[dict[str, Any], int]]) -> dict[str, tuple[dict[str, Any], int]]:
    """Every shardify RAW row also consumed per sample (loader_child.FORMS); the peers' own form is
    per sample already."""
    return {name: ({**spec, "forms": list(FORMS)} if spec["loader"] == "shardify" and spec["task"] == "raw"
                   else spec, repeats) for name, (spec, repeats) in specs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--num-images", type=int, default=10_000)
    parser.add_argument("--quality", type=int, default=DEFAULT_QUALITY,
                        help="JPEG quality of the synthetic images (88: ~100 KB each; 78: ~74 KB)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--decode-epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-repeats", type=int, default=1, help="repeats of the DECODE rows and the x4 row")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--work", default="out/bench", help="where data is generated and cached")
    parser.add_argument("--no-s3", action="store_true", help="skip the runs against a local SeaweedFS")
    parser.add_argument("--no-x4", action="store_true", help="no 4x dataset (its copies take minutes to make)")
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
    data = prepare(work, args.num_images, args.quality, x4=not args.no_x4)
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
        shardify(Path(data["folder"]), url, env)
        os.environ.update(env)  # for tar_urls here; children get env explicitly
        spec = {**base, "url": url, "tars": tar_urls(url), "task": "raw", "source": "s3"}
        res |= interleaved(with_forms({f"{kind}/{TORCH}/raw/s3": ({**spec, "loader": kind}, repeats)
                                       for kind in ("shardify", "webdataset")}), env)
        with DelayProxy(server.endpoint_url, delay_s=0.05) as proxy:
            slow = {**env, "AWS_ENDPOINT_URL": proxy.url}
            res |= interleaved(with_forms({
                f"shardify/{TORCH}/raw/s3+50ms": ({**spec, "loader": "shardify", "source": "s3+50ms"}, repeats),
                f"webdataset/{TORCH}/raw/s3+50ms": ({**spec, "loader": "webdataset", "source": "s3+50ms"},
                                                    peer_repeats),
            }), slow)
    return res


def run_mix(work: Path, args: argparse.Namespace) -> int:
    """The mixing rows alone (no peers, no x4 data): results_mix.md."""
    folder = make_images(work, args.num_images)
    shards = work / f"shards-{args.num_images}"
    if not (shards / "manifest.json").exists():
        shardify(folder, str(shards))
    data = {"shards": str(shards), "halves": prepare_halves(work, str(folder))}
    load_start = os.getloadavg()
    res = interleaved(mix_specs(data, args))
    from benchmarks.loader_report import write_mix_results

    write_mix_results(ROOT / "benchmarks" / "results_mix.md", res, args, load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())

