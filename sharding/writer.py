"""`shardify write`: plan which samples go to which shard, write shards in parallel, publish the manifest last.

The plan (a list of sample runs, one per shard) is computed in the parent from the scanned refs
and the seed alone, so the output is the same for any number of workers. Each worker writes
whole shards, each published atomically (`Store.open_atomic`); the manifest goes last, so a
prefix whose writing was interrupted — even by kill -9 — has no manifest and is no dataset.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dataio.format.manifest import MANIFEST_NAME, Manifest, write_manifest
from dataio.format.manifest_parts import PARTS_DIR
from dataio.rand import mix64
from dataio.format.tar_index import TAR_BLOCK
from dataio.storage.store import Store, redact
from sharding.config import Layout, ShardResult, WriteConfig, layout_of
from sharding.parallel import run_parallel
from sharding.shard import write_shard
from sharding.sources.base import Ref, Source, SourceError

__all__ = ["WriteConfig", "WriteReport", "plan_shards", "prepare_destination", "write_dataset"]

SHARD_DIR = "shards"


def estimate_bytes(ref: Ref, fmt: str) -> int:
    """Bytes a sample adds to a shard before it is written (tar: headers and padding included)."""
    if fmt == "parquet":
        return ref.size_bytes + 16
    return ref.size_bytes + ref.num_members * (2 * TAR_BLOCK)


def plan_shards(refs: Sequence[Ref], config: WriteConfig) -> list[list[int]]:
    """Sample numbers per shard, in write order: shuffled by seed, cut at the size or count limit."""
    order = list(range(len(refs)))
    if config.shuffle:
        random.Random(config.seed).shuffle(order)
    shards: list[list[int]] = []
    current: list[int] = []
    size = 0
    limit = config.max_samples_per_shard
    for i in order:
        est = estimate_bytes(refs[i], config.format)
        if current and (size + est > config.shard_size_bytes or (limit is not None and len(current) >= limit)):
            shards.append(current)
            current, size = [], 0
        current.append(i)
        size += est
    if current:
        shards.append(current)
    return shards


SHARDS_PER_PREFIX = 10_000  # the default --prefixes: one per this many shards, a power of two
MAX_DEFAULT_PREFIXES = 1024


def default_prefixes(num_shards: int) -> int:
    """--prefixes when not given: 1 up to 10k shards (today's layout), then one per ~10k, a power of two.

    2M shards -> 256 prefixes: a 1,000-node job reading at 3,000 samples/s per rank stays well
    under S3's 5,500 GETs/s per prefix (benchmarks/README.md, "Scale").
    """
    wanted = -(-num_shards // SHARDS_PER_PREFIX)
    return 1 if wanted <= 1 else min(MAX_DEFAULT_PREFIXES, 1 << (wanted - 1).bit_length())


def shard_name(index: int, num_shards: int, fmt: str, num_prefixes: int = 1) -> str:
    """shards/shard-000123.tar, or with prefixes shards/7f/shard-000123.tar (7f: a hash of the number).

    The hash spreads consecutive shards over the prefixes (S3 limits requests per prefix) and is
    fixed by the shard number alone, so every engine and rerun places a shard in the same place.
    """
    width = max(6, len(str(num_shards - 1)))
    name = f"shard-{index:0{width}d}.{fmt}"
    if num_prefixes <= 1:
        return f"{SHARD_DIR}/{name}"
    prefix = mix64(index) % num_prefixes
    return f"{SHARD_DIR}/{prefix:0{max(2, len(f'{num_prefixes - 1:x}'))}x}/{name}"



def prepare_destination(dest: Store, overwrite: bool) -> None:
    """Refuse a non-empty DEST unless overwriting; then remove the old manifest first, then old shards."""
    existing = dest.list()
    if not existing:
        return
    if not overwrite:
        raise SourceError(
            f"{dest.url} is not empty ({len(existing)} files, e.g. {existing[0]!r}); choose an empty "
            "destination, or pass --overwrite to replace the dataset there"
        )
    foreign = [p for p in existing if p != MANIFEST_NAME and not p.startswith((SHARD_DIR + "/", PARTS_DIR + "/"))]
    if foreign:
        raise SourceError(
            f"{dest.url} holds files shardify did not write ({foreign[:3]}); refusing to delete them even "
            "with --overwrite; choose another destination"
        )
    # Manifest first: from this moment the prefix is no dataset, so no reader sees a mix.
    dest.remove(MANIFEST_NAME)
    for rel in existing:
        if rel != MANIFEST_NAME:
            dest.remove(rel)


def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardify")
    except PackageNotFoundError:
        return "0+unknown"


def _manifest(results: list[ShardResult], source: Source, config: WriteConfig, layout: Layout) -> Manifest:
    kept = [r for r in sorted(results, key=lambda r: r.index) if r.num_samples]
    tar = config.format == "tar"
    return Manifest(
        format=config.format, fields=layout.fields(config.format),
        shard_paths=tuple(r.path for r in kept), shard_num_samples=tuple(r.num_samples for r in kept),
        shard_num_bytes=tuple(r.num_bytes for r in kept), shard_checksums=tuple(r.checksum for r in kept),
        index_paths=tuple(r.index_path for r in kept) if tar else (),  # type: ignore[misc]
        index_num_bytes=tuple(r.index_bytes for r in kept) if tar else (),  # type: ignore[misc]
        index_checksums=tuple(r.index_checksum for r in kept) if tar else (),  # type: ignore[misc]
        row_groups=() if tar else tuple(r.row_groups for r in kept),  # type: ignore[misc]
        tool_version=tool_version(), created_utc=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        source=redact(source.description), label_names=source.label_names,
        skipped=tuple(s for r in sorted(results, key=lambda r: r.index) for s in r.skipped),
    )


@dataclass(kw_only=True)
class WriteReport:
    """What a finished write produced: its manifest, the seconds it took, the source bytes read."""

    manifest: Manifest
    seconds: float
    source_bytes: int
    skipped: list[dict[str, str]] = field(default_factory=list)


def write_dataset(source: Source, dest: Store, config: WriteConfig, progress: Any) -> WriteReport:
    """Write every shard, then the manifest; raises (and writes no manifest) if anything fails."""
    start = time.perf_counter()
    prepare_destination(dest, config.overwrite)
    layout = layout_of(source, config)
    plan = plan_shards(source.refs, config)
    prefixes = config.num_prefixes or default_prefixes(len(plan))
    tasks = [(i, shard_name(i, len(plan), config.format, prefixes), [source.refs[j] for j in run])
             for i, run in enumerate(plan)]
    if config.engine == "ray":
        from sharding.engine_ray import run_ray

        results = run_ray(tasks, source, dest, config, layout, progress, address=config.ray_address)
    elif config.num_workers == 1 or len(tasks) == 1:
        results = []
        for task in tasks:
            results.append(write_shard(task, source, dest, config, layout, progress.update))
            progress.log_shard(results[-1])
    else:
        results = run_parallel(tasks, source, dest, config, layout, progress)
    manifest = _manifest(results, source, config, layout)
    if manifest.num_shards == 0:
        raise SourceError(
            f"{source.description}: every sample was skipped ({len(manifest.skipped)}; first: "
            f"{manifest.skipped[0]['reason'] if manifest.skipped else '-'}); nothing to write"
        )
    write_manifest(dest, manifest, parts_threshold=config.parts_threshold)
    return WriteReport(manifest=manifest, seconds=time.perf_counter() - start,
                       source_bytes=sum(r.size_bytes for r in source.refs), skipped=list(manifest.skipped))
