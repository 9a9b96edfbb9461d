"""Corruption: a flipped byte in a shard, an index or a cache entry is refused (or healed), never
served as good."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from dataio.format.manifest import read_manifest
from dataio.format.tar_index import build_index
from dataio.storage.store import StorageOptions, Store
from tools.faults.common import Row, Size, contents, epoch_ids, shardify, write_raw_dataset


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
    served = contents(loader)
    truth = contents(make_loader(str(root), batch_size=8, num_workers=0, decode=None, tail="pad", shuffle=False))
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
    verify = shardify(["verify", str(root), "--quiet"])
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
    served = contents(loader)
    return Row(group="corrupt", scenario=f"{len(entries)} changed and re-sealed cache entries",
               figure="refused and re-read" if served == truth else "SERVED changed bytes", passed=served == truth,
               note="per-sample checksums (verify_checksums=True)")
