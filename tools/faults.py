"""The fault-injection suite: each scenario's figure and pass/fail, written to benchmarks/results_faults.md.

    python -m tools.faults            # the full suite (a few minutes), `make faults`
    python -m tools.faults --short    # the small form CI runs through tests/tools/test_faults.py

Scenarios run against a local SeaweedFS (tools.s3_server) behind tools.delay_proxy: loader
epochs through 503s, resets, truncated bodies and 2-second stalls (every sample exactly once?
throughput against no fault, with and without hedged reads); `shardify write` through failing
PUTs (a complete dataset or a clean failure, never a false success); kill -9 of `shardify write`
mid-write (locally and on S3: no manifest over a partial dataset, and a rerun completes);
corrupted shards (one byte of one sample, same size), indexes and cache entries; a truncated newest checkpoint under
`--resume auto`; kill -9 and SIGSTOP of a trainer rank under `torchrun --max-restarts`
(committed steps exactly once; time to detect). Pass/fail judges correctness only; throughput ratios are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dataio.format.checksums import dumps_sums, sample_sums, sums_path
from dataio.format.manifest import Field, Manifest, checksum_bytes, read_manifest, write_manifest
from dataio.format.tar_index import build_index
from dataio.storage.store import RetryPolicy, StorageOptions, Store
from tools.delay_proxy import DelayProxy

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results_faults.md"


@dataclass(frozen=True, kw_only=True, slots=True)
class Size:
    """How big the suite's dataset and runs are."""

    num_shards: int
    samples_per_shard: int
    sample_bytes: int
    images: int  # images in the folder `shardify write` shards
    epochs: int  # loader epochs per fault scenario (the figure is their mean rate)


SHORT = Size(num_shards=16, samples_per_shard=16, sample_bytes=4096, images=24, epochs=1)
FULL = Size(num_shards=48, samples_per_shard=64, sample_bytes=32 * 1024, images=120, epochs=7)


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One scenario's outcome: what was done, its figure, and whether the behaviour was correct."""

    group: str
    scenario: str
    figure: str
    passed: bool
    note: str = ""


# --- the dataset and the loader scenarios ---------------------------------------------------


def write_raw_dataset(store: Store, size: Size, *, seed: int = 0) -> int:
    """Tar shards of random-bytes samples (`bin` + `cls`) with their indexes, per-sample checksums and
    manifest; returns the sample count."""
    rng = random.Random(seed)
    cols: dict[str, list[Any]] = {k: [] for k in ("path", "n", "bytes", "sum", "ipath", "ibytes", "isum", "ssum")}
    for s in range(size.num_shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(size.samples_per_shard):
                key = f"{s * size.samples_per_shard + i:08d}"
                for ext, data in (("bin", rng.randbytes(size.sample_bytes)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        tar_index = build_index(io.BytesIO(data))
        index, sums = tar_index.dumps(), dumps_sums(sample_sums(data, tar_index.samples))
        rel = f"shards/shard-{s:06d}.tar"
        store.write_bytes(rel, data)
        store.write_bytes(rel + ".idx", index)
        store.write_bytes(sums_path(rel), sums)
        for k, v in zip(cols, (rel, size.samples_per_shard, len(data), checksum_bytes(data), rel + ".idx",
                               len(index), checksum_bytes(index), checksum_bytes(sums))):
            cols[k].append(v)
    write_manifest(store, Manifest(
        format="tar", fields=(Field(name="bin", type="bytes"), Field(name="cls", type="int")),
        shard_paths=tuple(cols["path"]), shard_num_samples=tuple(cols["n"]), shard_num_bytes=tuple(cols["bytes"]),
        shard_checksums=tuple(cols["sum"]), index_paths=tuple(cols["ipath"]), index_num_bytes=tuple(cols["ibytes"]),
        index_checksums=tuple(cols["isum"]), sums_checksums=tuple(cols["ssum"]), source="tools.faults",
    ))
    return size.num_shards * size.samples_per_shard


def epoch_ids(url: str, options: StorageOptions, *, epoch: int, **kwargs: Any) -> tuple[list[int], float, Any]:
    """(sample ids delivered, seconds, loader stats) of one epoch, padded so every sample should come once."""
    from dataio import make_loader

    loader = make_loader(url, batch_size=8, num_workers=2, decode=None, tail="pad", storage=options,
                         check_shards=False, **kwargs)
    try:
        loader.set_epoch(epoch)
        start = time.perf_counter()
        ids = [int(k) for b in loader for k, keep in zip(b["__key__"], b["mask"].tolist()) if keep]
        return ids, time.perf_counter() - start, loader.stats
    finally:
        loader.close()


LOADER_FAULTS: list[tuple[str, dict[str, Any], bool]] = [
    ("no fault", {}, True),
    ("10% 503 SlowDown", {"error_rate": 0.1}, True),
    ("10% connection resets", {"reset_rate": 0.1}, True),
    ("10% truncated bodies", {"truncate_rate": 0.1}, True),
    ("5% 2-second stalls, hedged", {"stall_rate": 0.05, "stall_s": 2.0}, True),
    ("5% 2-second stalls, no hedging", {"stall_rate": 0.05, "stall_s": 2.0}, False),
]


def loader_scenarios(server: Any, size: Size, seed: int, only: tuple[str, ...] = ()) -> list[Row]:
    """Epochs through each fault, the faults interleaved round by round in a turning order (so a
    busy spell of the machine hits every one alike): exactly once, and the median samples/s
    against no fault. `only`: the faults whose name holds one of these words (no fault always runs)."""
    import statistics

    faults_run = [f for f in LOADER_FAULTS if f[0] == "no fault" or not only or any(w in f[0] for w in only)]
    bucket = server.new_bucket()
    url = f"s3://{bucket}/raw"
    total = write_raw_dataset(Store(url, server.options()), size, seed=seed)
    rates: dict[str, list[float]] = {name: [] for name, _, _ in faults_run}
    ok = dict.fromkeys(rates, True)
    hedges = {name: [0, 0] for name in rates}
    seen: dict[str, list[int]] = {name: [0] * 6 for name in rates}
    for epoch in range(size.epochs):
        # The order turns each round: no scenario always runs first (after the machine was idle)
        # or right after the same neighbour.
        turn = epoch % len(faults_run)
        for name, faults, hedge in faults_run[turn:] + faults_run[:turn]:
            with DelayProxy(server.endpoint_url, delay_s=0.0, seed=seed + epoch, **faults) as proxy:
                options = replace(server.options(), endpoint_url=proxy.url,
                                  hedge=StorageOptions().hedge if hedge else None)
                ids, seconds, stats = epoch_ids(url, options, epoch=epoch)
            ok[name] = ok[name] and sorted(ids) == list(range(total))
            rates[name].append(total / seconds)
            hedges[name][0] += stats.hedged_reads
            hedges[name][1] += stats.ranged_reads
            p = proxy.stats
            for i, n in enumerate((p.num_requests, p.num_errors, p.num_resets, p.num_truncated, p.num_hangs,
                                   p.num_stalls)):
                seen[name][i] += n
    base = statistics.median(rates["no fault"])
    rows = []
    for name, _, hedge in faults_run:
        rate = statistics.median(rates[name])
        # Paired by round too: each round's ratio to that round's no-fault epoch (drift cancels).
        ratios = [r / b for r, b in zip(rates[name], rates["no fault"])]
        paired = statistics.median(ratios)
        figure = (f"{rate:,.0f} samples/s, {rate / base:.0%} of no fault (median of {len(rates[name])} epochs; "
                  f"median per-round ratio {paired:.0%}" + ("" if name == "no fault" else
                  f", rounds {min(ratios):.0%}-{max(ratios):.0%}") + ")")
        if hedge:
            figure += f"; {hedges[name][0]} of {hedges[name][1]} reads hedged"
        n = seen[name]
        rows.append(Row(group="loader", scenario=f"epoch through {name}", figure=figure, passed=ok[name],
                        note=f"proxy: {n[0]} requests, {n[1]} 503s, {n[2]} resets, {n[3]} truncated, {n[4]} hung, "
                             f"{n[5]} stalled" + ("" if ok[name] else "; samples missing or repeated")))
    return rows


def _faults_seen(proxy: DelayProxy) -> str:
    s = proxy.stats
    return (f"{s.num_errors} 503s, {s.num_resets} resets, {s.num_truncated} truncated, "
            f"{s.num_hangs} hung, {s.num_stalls} stalled")


# --- shardify write through faults, and killed mid-write --------------------------------------


def make_image_folder(root: Path, num_images: int, *, seed: int = 0) -> Path:
    """ROOT/CLASS/N.jpg: small distinct JPEGs in three classes."""
    from PIL import Image

    rng = random.Random(seed)
    for i in range(num_images):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32 + i % 7, 24), tuple(rng.randrange(256) for _ in range(3))).save(d / f"{i}.jpg")
    return root


def _shardify(args: list[str], *, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sharding.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=_env())


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


def _flags(server: Any, endpoint: str | None = None) -> list[str]:
    return ["--endpoint-url", endpoint or server.endpoint_url, "--access-key", server.key,
            "--secret-key", server.secret, "--region", "us-east-1"]


def judge_write(code: int, store: Store, num_images: int) -> tuple[str, bool]:
    """'complete' (exit 0, every sample readable once), 'clean failure' (exit != 0, no manifest), or a false success."""
    try:
        manifest = read_manifest(store)
    except Exception:  # noqa: BLE001 - no (readable) manifest
        manifest = None
    if code != 0:
        return ("clean failure", True) if manifest is None else ("FAILED but published a manifest", False)
    if manifest is None:
        return "FALSE SUCCESS: exit 0, no manifest", False
    try:
        ids, _, _ = epoch_ids(store.raw_url, store.options, epoch=0, fields=("cls",))
    except Exception as exc:  # noqa: BLE001 - a shard the manifest lists is not there
        return f"FALSE SUCCESS: exit 0, dataset unreadable ({type(exc).__name__})", False
    complete = sorted(ids) == list(range(num_images)) and manifest.num_samples == num_images
    return ("complete" if complete else "FALSE SUCCESS: exit 0, samples missing"), complete


WRITE_FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("10% of PUTs 503", {"error_rate": 0.1, "methods": ("PUT", "POST")}),
    ("10% of PUTs reset", {"reset_rate": 0.1, "methods": ("PUT", "POST")}),
    ("10% truncated responses", {"truncate_rate": 0.1, "methods": ("GET", "PUT", "POST", "HEAD")}),
    ("5% 2-second stalls", {"stall_rate": 0.05, "stall_s": 2.0, "methods": ("GET", "PUT", "POST", "HEAD")}),
    ("every PUT 503", {"error_rate": 1.0, "methods": ("PUT", "POST")}),
]


def write_scenarios(server: Any, size: Size, workdir: Path, seed: int) -> list[Row]:
    """`shardify write` to S3 through each fault: complete or a clean failure, never a false success."""
    images = make_image_folder(workdir / "images", size.images, seed=seed)
    rows = []
    for name, faults in WRITE_FAULTS:
        bucket = server.new_bucket()
        with DelayProxy(server.endpoint_url, delay_s=0.0, seed=seed, **faults) as proxy:
            start = time.perf_counter()
            result = _shardify(["write", str(images), f"s3://{bucket}/ds", "--max-samples-per-shard", "8",
                                "--workers", "1", "--quiet", *_flags(server, proxy.url)])
            seconds = time.perf_counter() - start
        outcome, ok = judge_write(result.returncode, Store(f"s3://{bucket}/ds", server.options()), size.images)
        rows.append(Row(group="write", scenario=f"shardify write through {name}",
                        figure=f"{outcome}, exit {result.returncode}, {seconds:.1f} s", passed=ok,
                        note=f"{_faults_seen(proxy)}" + ("" if ok else f"; stderr: {result.stderr.strip()[-200:]}")))
    return rows


def kill_scenarios(server: Any, size: Size, workdir: Path, seed: int) -> list[Row]:
    """kill -9 of `shardify write` once a shard is out: no manifest over the partial dataset; a rerun completes."""
    images = workdir / "images"
    if not images.exists():
        make_image_folder(images, size.images, seed=seed)
    rows = []
    for where in ("local", "S3"):
        if where == "local":
            url, flags, store = str(workdir / "killed"), [], Store(str(workdir / "killed"))
        else:
            bucket = server.new_bucket()
            url, flags = f"s3://{bucket}/ds", _flags(server)
            store = Store(url, server.options())
        # A slow write: 100 ms per request through the proxy on S3, one image per shard locally.
        with DelayProxy(server.endpoint_url, delay_s=0.1) as proxy:
            if where == "S3":
                flags = _flags(server, proxy.url)
            proc = subprocess.Popen([sys.executable, "-m", "sharding.cli", "write", str(images), url,
                                     "--max-samples-per-shard", "1", "--workers", "1", "--quiet", *flags],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
            started = time.perf_counter()
            while proc.poll() is None and time.perf_counter() - started < 120:
                if any(p.endswith(".tar") for p in _safe_list(store)):
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        partial = [p for p in _safe_list(store) if p.endswith(".tar")]
        no_manifest = not any(p == "manifest.json" for p in _safe_list(store))
        rerun = _shardify(["write", str(images), url, "--max-samples-per-shard", "8", "--workers", "1",
                           "--overwrite", "--quiet", *_flags(server)] if where == "S3" else
                          ["write", str(images), url, "--max-samples-per-shard", "8", "--workers", "1",
                           "--overwrite", "--quiet"])
        outcome, ok = judge_write(rerun.returncode, store, size.images)
        rows.append(Row(group="kill", scenario=f"kill -9 of shardify write mid-write ({where})",
                        figure=f"{len(partial)} shard(s) out at the kill, manifest: {'none' if no_manifest else 'PRESENT'}; "
                               f"rerun with --overwrite: {outcome}",
                        passed=no_manifest and ok,
                        note="" if ok else rerun.stderr.strip()[-200:]))
    return rows


def _contents(loader: Any) -> dict[int, bytes]:
    """Sample id -> its `bin` bytes, over one epoch."""
    out = {}
    for batch in loader:
        for i, (key, keep) in enumerate(zip(batch["__key__"], batch["mask"].tolist())):
            if keep:
                out[int(key)] = bytes(batch["bin"][i])
    return out


def _safe_list(store: Store) -> list[str]:
    try:
        return Store(store.raw_url, store.options, RetryPolicy(max_attempts=1)).list()
    except Exception:  # noqa: BLE001 - nothing there yet
        return []


# --- corruption ----------------------------------------------------------------------------------


def corruption_scenarios(workdir: Path, size: Size, seed: int) -> list[Row]:
    """A flipped byte in a shard, an index, a cache entry: detected (or healed), never served as good."""
    from dataio import ShardifyError

    rows = []
    root = workdir / "corrupt"
    store = Store(str(root))
    total = write_raw_dataset(store, replace(size, num_shards=2), seed=seed)
    good = {int(i): None for i in range(total)}
    manifest = read_manifest(store)
    # An index: its checksum is in the manifest.
    index_rel = manifest.index_paths[0]
    original = store.read(index_rel)
    store.write_bytes(index_rel, original.replace(b"bin", b"bim", 1))
    try:
        epoch_ids(str(root), StorageOptions(), epoch=0)
        rows.append(Row(group="corrupt", scenario="a changed index", figure="served", passed=False))
    except ShardifyError as exc:
        rows.append(Row(group="corrupt", scenario="a changed index",
                        figure=f"refused: {type(exc).__name__}", passed="index" in str(exc)))
    store.write_bytes(index_rel, original)
    # A cache entry: each keeps its checksum; a changed one is dropped and read again.
    cache_dir = workdir / "cache"
    ids, _, _ = epoch_ids(str(root), StorageOptions(), epoch=0, cache_dir=str(cache_dir), cache_limit_bytes=1 << 30)
    entries = [p for p in cache_dir.rglob("*") if p.is_file() and "tmp" not in p.relative_to(cache_dir).parts]
    for p in entries:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    from dataio import make_loader

    loader = make_loader(str(root), batch_size=8, num_workers=0, decode=None, tail="pad",
                         cache_dir=str(cache_dir), cache_limit_bytes=1 << 30, shuffle=False)
    served = _contents(loader)
    truth = _contents(make_loader(str(root), batch_size=8, num_workers=0, decode=None, tail="pad", shuffle=False))
    rows.append(Row(group="corrupt", scenario=f"{len(entries)} changed cache entries",
                    figure="refused and re-read" if served == truth else "SERVED changed bytes",
                    passed=served == truth and set(served) == set(good)))
    rows.append(_resealed_cache_entries(root, cache_dir, truth))
    # A shard, one byte of one sample, same size: the per-sample checksums (loader) and the
    # whole-shard one (`shardify verify`) both see it.
    shard = root / manifest.shard_paths[0]
    sample = build_index(io.BytesIO(shard.read_bytes())).samples[1]
    data = bytearray(shard.read_bytes())
    data[sample.members[0].offset + 100] ^= 0xFF  # inside the second sample's data
    shard.write_bytes(bytes(data))
    try:
        epoch_ids(str(root), StorageOptions(), epoch=0)
        rows.append(Row(group="corrupt", scenario="a flipped byte in a shard, same size (loader)",
                        figure="SERVED changed bytes", passed=False))
    except ShardifyError as exc:
        named = manifest.shard_paths[0] in str(exc) and repr(sample.key) in str(exc)
        rows.append(Row(group="corrupt", scenario="a flipped byte in a shard, same size (loader)",
                        figure=f"refused: {type(exc).__name__} naming shard and key", passed=named,
                        note="per-sample checksums (verify_checksums=True, the default)"))
    verify = _shardify(["verify", str(root), "--quiet"])
    rows.append(Row(group="corrupt", scenario="a flipped byte in a shard (shardify verify)",
                    figure=f"verify exit {verify.returncode}",
                    passed=verify.returncode != 0 and sample.key in verify.stdout))
    return rows


def _resealed_cache_entries(root: Path, cache_dir: Path, truth: dict[int, bytes]) -> Row:
    """Cache entries changed and re-sealed (their own digest recomputed, so the cache's check
    passes): the per-sample checksums catch them; the store's bytes are served instead."""
    import xxhash

    from dataio import make_loader
    from dataio.storage.cache import DIGEST_BYTES

    entries = [p for p in cache_dir.rglob("*") if p.is_file() and "tmp" not in p.relative_to(cache_dir).parts]
    for p in entries:
        data = bytearray(p.read_bytes()[:-DIGEST_BYTES])
        data[10] ^= 0xFF  # inside a sample's data: an entry starts at a segment's first data byte
        p.write_bytes(bytes(data) + xxhash.xxh3_64_digest(bytes(data)))
    loader = make_loader(str(root), batch_size=8, num_workers=0, decode=None, tail="pad",
                         cache_dir=str(cache_dir), cache_limit_bytes=1 << 30, shuffle=False)
    served = _contents(loader)
    return Row(group="corrupt", scenario=f"{len(entries)} changed and re-sealed cache entries",
               figure="refused and re-read" if served == truth else "SERVED changed bytes", passed=served == truth,
               note="per-sample checksums (verify_checksums=True)")


# --- checkpoints -------------------------------------------------------------------------------------


def checkpoint_scenarios(workdir: Path) -> list[Row]:
    """A truncated newest checkpoint: --resume auto falls back to the previous complete one and says so."""
    out = workdir / "train"
    base = [sys.executable, "-m", "trainer", "--data", "synthetic:?samples=64&classes=4", "--model", "mlp",
            "--batch-size", "8", "--image-size", "8", "--checkpoint-every", "1", "--keep-checkpoints", "3",
            "--out", str(out), "--no-live", "--device", "cpu"]
    first = subprocess.run([*base, "--max-steps", "2"], capture_output=True, text=True, timeout=300, env=_env())
    ckpts = sorted((out / "checkpoints").glob("ckpt-*.pt"))
    if first.returncode != 0 or not ckpts:
        return [Row(group="checkpoint", scenario="truncated newest checkpoint", figure="setup failed",
                    passed=False, note=first.stderr.strip()[-300:])]
    newest = ckpts[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    start = time.perf_counter()
    second = subprocess.run([*base, "--max-steps", "3"], capture_output=True, text=True, timeout=300, env=_env())
    seconds = time.perf_counter() - start
    notes = (out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""
    skipped = f"skipped checkpoint {newest.name}" in notes
    ok = second.returncode == 0 and skipped
    return [Row(group="checkpoint", scenario="truncated newest checkpoint, --resume auto",
                figure=f"exit {second.returncode}, fell back past {newest.name}: {'yes' if skipped else 'no'} "
                       f"({seconds:.1f} s)", passed=ok, note="" if ok else second.stderr.strip()[-300:])]


def _committed_once(out: Path) -> tuple[bool, int]:
    """(every committed step present once and no sample key twice, number of committed steps)."""
    steps: dict[int, list[str]] = {}
    for path in sorted(out.glob("keys-rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            steps.setdefault(rec["step"], []).extend(rec["keys"])
    if not steps:
        return False, 0
    keys = [k for ks in steps.values() for k in ks]
    epochs_keys: dict[str, int] = {}
    for k in keys:
        epochs_keys[k] = epochs_keys.get(k, 0) + 1
    contiguous = sorted(steps) == list(range(1, max(steps) + 1))
    # Every sample comes once per epoch: no key more often than any other by more than one epoch.
    counts = sorted(epochs_keys.values())
    return contiguous and counts[-1] - counts[0] <= 1, len(steps)


def rank_pid(root_pid: int, rank: int) -> int | None:
    """The pid of the trainer process of `rank` among the descendants of `root_pid` (torchrun), or None."""
    import psutil

    for proc in psutil.Process(root_pid).children(recursive=True):
        try:
            if proc.environ().get("RANK") == str(rank) and "trainer" in " ".join(proc.cmdline()):
                return proc.pid
        except psutil.Error:
            continue
    return None


def trainer_rank_scenarios(workdir: Path, size: Size, seed: int) -> list[Row]:
    """kill -9 and SIGSTOP of rank 1 mid-epoch under torchrun --max-restarts=1: committed steps exactly once,
    and how long until the fault is detected (SIGSTOP: the rank named) and the job is done."""
    images = workdir / "images"
    if not images.exists():
        make_image_folder(images, size.images, seed=seed)
    data = workdir / "rank-ds"
    if not (data / "manifest.json").exists():
        _shardify(["write", str(images), str(data), "--max-samples-per-shard", "8", "--quiet"])
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    rows = []
    for name, sig in (("kill -9", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
        out = workdir / f"rank-{sig.name}"
        cmd = [torchrun, "--standalone", "--nproc_per_node=2", "--max-restarts=1", "--monitor-interval=0.2",
               "-m", "trainer", "--data", str(data), "--num-classes", "3", "--model", "mlp", "--batch-size", "2",
               "--image-size", "8", "--num-workers", "0", "--record-keys", "--checkpoint-every", "2",
               "--dist-timeout-s", "15", "--epochs", str(max(3, 240 // size.images)), "--out", str(out),
               "--no-live", "--device", "cpu"]
        err_path = workdir / f"rank-{sig.name}.err"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env={**_env(), "OMP_NUM_THREADS": "1"},
                                    start_new_session=True)
        try:
            keys0, began = out / "keys-rank0.jsonl", time.monotonic()
            while proc.poll() is None and time.monotonic() - began < 180:
                if keys0.exists() and len(keys0.read_text().splitlines()) >= 3:
                    break
                time.sleep(0.1)
            pid = rank_pid(proc.pid, 1)
            if pid is None or proc.poll() is not None:
                rows.append(Row(group="trainer", scenario=f"{name} of rank 1", figure="rank 1 not found mid-run",
                                passed=False, note=err_path.read_text()[-300:]))
                continue
            os.kill(pid, sig)
            hit, detected_s = time.monotonic(), None
            while proc.poll() is None and time.monotonic() - hit < 300:
                if detected_s is None and "stopped responding" in err_path.read_text():
                    detected_s = time.monotonic() - hit
                time.sleep(0.2)
            done_s = time.monotonic() - hit
            code = proc.poll()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        once, num_steps = _committed_once(out)
        detect = (f"rank 1 named after {detected_s:.1f} s (--dist-timeout-s 15)" if detected_s is not None
                  else "rank not named" if sig == signal.SIGSTOP else "torchrun saw the exit")
        ok = code == 0 and once and (sig != signal.SIGSTOP or detected_s is not None)
        rows.append(Row(group="trainer", scenario=f"{name} of rank 1 mid-epoch, --max-restarts 1",
                        figure=f"{detect}; job done {done_s:.0f} s after the signal, exit {code}; "
                               f"{num_steps} committed steps, exactly once: {'yes' if once else 'NO'}",
                        passed=ok, note="" if ok else err_path.read_text()[-300:].replace("\n", " ")))
    return rows


# --- the suite ---------------------------------------------------------------------------------------

GROUPS: dict[str, Callable[..., list[Row]]] = {}


def run_suite(server: Any, workdir: Path, *, short: bool, seed: int = 1,
              groups: tuple[str, ...] = ("loader", "write", "kill", "corrupt", "checkpoint", "trainer"),
              loader_faults: tuple[str, ...] = (), epochs: int | None = None) -> list[Row]:
    """Every scenario of `groups` against `server` (an S3Server); rows in order. loader_faults: run only
    the loader faults whose name holds one of these words; epochs: loader rounds instead of the form's."""
    size = SHORT if short else FULL
    if epochs is not None:
        size = replace(size, epochs=epochs)
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    if "loader" in groups:
        rows += loader_scenarios(server, size, seed, loader_faults)
    if "write" in groups:
        rows += write_scenarios(server, size, workdir, seed)
    if "kill" in groups:
        rows += kill_scenarios(server, size, workdir, seed)
    if "corrupt" in groups:
        rows += corruption_scenarios(workdir, size, seed)
    if "checkpoint" in groups:
        rows += checkpoint_scenarios(workdir)
    if "trainer" in groups:
        rows += trainer_rank_scenarios(workdir, size, seed)
    return rows


def to_markdown(rows: list[Row], *, short: bool, machine: str, seconds: float) -> str:
    lines = [
        "# Fault-injection suite (`make faults` = `python -m tools.faults`)",
        "",
        f"Form: {'short (CI)' if short else 'full'}; {seconds:.0f} s in all. Machine: {machine}.",
        "Pass/fail judges correctness only (exactly once, complete or clean failure, refused corruption);",
        "throughput figures are reported, never asserted. Faults come from tools/delay_proxy.py in front",
        "of a local SeaweedFS (fixed seed), so both ends share this machine's cores.",
        "",
        "| group | scenario | figure | pass | note |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.group} | {r.scenario} | {r.figure} | {'PASS' if r.passed else 'FAIL'} | "
                     f"{r.note.replace('|', '/')} |")
    failed = [r for r in rows if not r.passed]
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} scenarios pass."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the suite against a fresh local SeaweedFS and write the results file; exit 1 if any scenario fails."""
    import tempfile

    from benchmarks.machine import describe_machine
    from tools.s3_server import S3Server

    parser = argparse.ArgumentParser(prog="python -m tools.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="the small CI form")
    parser.add_argument("--seed", type=int, default=1, help="the proxy's fault seed (runs are repeatable)")
    parser.add_argument("--groups", default="loader,write,kill,corrupt,checkpoint,trainer")
    parser.add_argument("--loader-faults", default="",
                        help="comma-separated words: only the loader faults whose name holds one (e.g. 'stalls'; "
                             "no fault always runs, as the base)")
    parser.add_argument("--epochs", type=int, default=None, help="loader rounds (default: the form's)")
    parser.add_argument("--out", default=str(RESULTS), help="results file (markdown)")
    args = parser.parse_args(argv)
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    only = tuple(w.strip() for w in args.loader_faults.split(",") if w.strip())
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardify-faults-") as tmp, S3Server() as server:
        rows = run_suite(server, Path(tmp), short=args.short, seed=args.seed, groups=groups,
                         loader_faults=only, epochs=args.epochs)
    m = describe_machine()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = f"{m['cpu']}, {m['cores']} cores, {m['memory']} RAM, load average {load} at the end"
    text = to_markdown(rows, short=args.short, machine=machine, seconds=time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(text)
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
