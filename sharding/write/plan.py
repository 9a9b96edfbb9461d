"""Which samples go to which shard, and where each shard goes: pure, from the scanned refs and the seed.

The plan is computed once, in the parent, so the output is the same for any number of workers,
either engine and every rerun (a resumed write finds its shards under the same names).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from dataio.format.tar_index import TAR_BLOCK
from dataio.format.versions import SHARD_DIR, shard_base
from dataio.rand import mix64
from sharding.sources.base import Ref
from sharding.write.config import ShardTask, WriteConfig

SHARDS_PER_PREFIX = 10_000  # the default --prefixes: one per this many shards, a power of two
MAX_DEFAULT_PREFIXES = 1024


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


def default_prefixes(num_shards: int) -> int:
    """--prefixes when not given: 1 up to 10k shards (today's layout), then one per ~10k, a power of two.

    2M shards -> 256 prefixes: a 1,000-node job reading at 3,000 samples/s per rank stays well
    under S3's 5,500 GETs/s per prefix (benchmarks/README.md, "Scale").
    """
    wanted = -(-num_shards // SHARDS_PER_PREFIX)
    return 1 if wanted <= 1 else min(MAX_DEFAULT_PREFIXES, 1 << (wanted - 1).bit_length())


def shard_name(index: int, num_shards: int, fmt: str, num_prefixes: int = 1, base: str = SHARD_DIR) -> str:
    """shards/shard-000123.tar, or with prefixes shards/7f/shard-000123.tar (7f: a hash of the number).

    The hash spreads consecutive shards over the prefixes (S3 limits requests per prefix) and is
    fixed by the shard number alone, so every engine and rerun places a shard in the same place.
    """
    width = max(6, len(str(num_shards - 1)))
    name = f"shard-{index:0{width}d}.{fmt}"
    if num_prefixes <= 1:
        return f"{base}/{name}"
    prefix = mix64(index) % num_prefixes
    return f"{base}/{prefix:0{max(2, len(f'{num_prefixes - 1:x}'))}x}/{name}"


def shard_tasks(plan: Sequence[Sequence[int]], refs: Sequence[Ref], *, generation: int, first: int,
                fmt: str, num_prefixes: int) -> list[ShardTask]:
    """The plan's shards as tasks of version `generation`, numbered from `first` (an append's old shards
    come before)."""
    base = shard_base(generation)
    total = first + len(plan)
    return [ShardTask(index=first + i, path=shard_name(first + i, total, fmt, num_prefixes, base),
                      refs=tuple(refs[j] for j in run)) for i, run in enumerate(plan)]
