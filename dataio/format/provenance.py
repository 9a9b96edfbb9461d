"""Where every sample came from: one small JSON sidecar per shard, beside its index.

`shards/shard-000042.sources.json` lists, in shard order, each sample's source: its path relative
to the source folder, `row N` of a table (or the path/URL the row named), or `SHARD.tar#KEY` of a
re-sharded tar. It sits beside the shard, never inside it, so stock readers (webdataset, DALI,
pyarrow) see exactly the user's samples. Batches carry only integers (`__shard__`,
`__position__`); `sources_of` maps them back to these strings when someone asks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from dataio.errors import ManifestError, StorageError
from dataio.format.manifest import Manifest, read_manifest
from dataio.storage.store import StorageOptions, Store

SOURCES_VERSION = 1
SOURCES_SUFFIX = ".sources.json"


def sources_path(shard_path: str) -> str:
    """The sidecar of a shard: `shards/shard-000042.tar` -> `shards/shard-000042.sources.json`."""
    return shard_path.rsplit(".", 1)[0] + SOURCES_SUFFIX


def dumps_sources(shard_path: str, checksum: str, sources: Sequence[str]) -> bytes:
    """The sidecar's bytes: the shard it describes (path and checksum, so a stale one is noticed)."""
    doc = {"shardify_sources": SOURCES_VERSION, "shard": shard_path, "checksum": checksum,
           "num_samples": len(sources), "sources": list(sources)}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def read_sources(store: Store, manifest: Manifest, shard: int) -> list[str]:
    """Every sample's source of manifest shard number `shard`, in shard order; ManifestError if
    the dataset has none (written before provenance existed, or by another tool) or it is stale."""
    rel = manifest.shard_paths[shard]
    where = store.url_of(sources_path(rel))
    try:
        doc = json.loads(store.read(sources_path(rel)))
    except StorageError as exc:
        raise ManifestError(
            f"{where}: no provenance for this shard ({exc}); datasets record sources from this shardify "
            "version on: rewrite it with `shardify write` to get them"
        ) from None
    except ValueError as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc}); rewrite the dataset") from None
    if (not isinstance(doc, dict) or doc.get("shardify_sources") != SOURCES_VERSION or doc.get("shard") != rel
            or doc.get("checksum") != manifest.shard_checksums[shard]
            or len(doc.get("sources", ())) != manifest.shard_num_samples[shard]):
        raise ManifestError(
            f"{where}: does not describe {rel} as the manifest lists it (version, checksum or sample count "
            "differ); it is stale: rewrite the dataset"
        )
    return [str(s) for s in doc["sources"]]


def sources_of(
    dataset: str | Any, shards: Iterable[int], positions: Iterable[int], *, storage: StorageOptions | None = None
) -> list[str]:
    """The source of each (shard number, position) pair, e.g. a batch's `__shard__` and `__position__`.

    `dataset` is the dataset URL or a ShardLoader (its store and manifest are reused). Each
    shard's sidecar is read once per call.
    """
    if isinstance(dataset, str):
        store = Store(dataset, storage)
        manifest = read_manifest(store)
    else:
        store, manifest = dataset.store, dataset.manifest
    cache: dict[int, list[str]] = {}
    out = []
    for shard, position in zip((int(s) for s in shards), (int(p) for p in positions), strict=True):
        if not 0 <= shard < manifest.num_shards:
            raise ValueError(f"shard number {shard} is outside 0..{manifest.num_shards - 1}")
        if shard not in cache:
            cache[shard] = read_sources(store, manifest, shard)
        if not 0 <= position < len(cache[shard]):
            raise ValueError(f"position {position} is outside shard {shard} of {len(cache[shard])} samples")
        out.append(cache[shard][position])
    return out
