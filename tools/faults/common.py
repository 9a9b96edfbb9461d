"""What the fault scenarios share: the suite's sizes and rows, a raw dataset, one loader epoch,
`shardify` in a new interpreter, and the judge of a write (complete, or a clean failure)."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataio.format.checksums import dumps_sums, sample_sums, sums_path
from dataio.format.manifest import Field, Manifest, checksum_bytes, read_manifest, write_manifest
from dataio.format.tar_index import build_index
from dataio.storage.store import RetryPolicy, StorageOptions, Store
from tools.delay_proxy import DelayProxy

ROOT = Path(__file__).resolve().parents[2]  # the checkout: `python -m sharding.cli` runs from it


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


def faults_seen(proxy: DelayProxy) -> str:
    """The faults the proxy injected, for a row's note."""
    s = proxy.stats
    return (f"{s.num_errors} 503s, {s.num_resets} resets, {s.num_truncated} truncated, "
            f"{s.num_hangs} hung, {s.num_stalls} stalled")


def make_image_folder(root: Path, num_images: int, *, seed: int = 0) -> Path:
    """ROOT/CLASS/N.jpg: small distinct JPEGs in three classes."""
    from PIL import Image

    rng = random.Random(seed)
    for i in range(num_images):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32 + i % 7, 24), tuple(rng.randrange(256) for _ in range(3))).save(d / f"{i}.jpg")
    return root


def shardify(args: list[str], *, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`shardify ARGS` in a new interpreter (a crash or kill there is its own, not the suite's)."""
    return subprocess.run([sys.executable, "-m", "sharding.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env())


def env() -> dict[str, str]:
    """This environment with the checkout on PYTHONPATH, for the programs the suite starts."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def s3_flags(server: Any, endpoint: str | None = None) -> list[str]:
    """The CLI flags that reach `server`, or `endpoint` (a proxy in front of it)."""
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


def contents(loader: Any) -> dict[int, bytes]:
    """Sample id -> its `bin` bytes, over one epoch."""
    out = {}
    for batch in loader:
        for i, (key, keep) in enumerate(zip(batch["__key__"], batch["mask"].tolist())):
            if keep:
                out[int(key)] = bytes(batch["bin"][i])
    return out


def safe_list(store: Store) -> list[str]:
    """The store's paths, or none while it does not exist yet (one attempt, no retries)."""
    try:
        return Store(store.raw_url, store.options, RetryPolicy(max_attempts=1)).list()
    except Exception:  # noqa: BLE001 - nothing there yet
        return []
