"""What a resumed run skips, as global sample ids: optimizer steps A..B (the samples the plan gave
them, at the topology that ran them, from a checkpoint's loader-state sidecar) or a file of sample
keys or ids. ShardLoader.skip(ids) then drops them from the rest of the run (plan/skip.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dataio.errors import StateError
from dataio.format.manifest import Manifest
from dataio.loader.sidecar import SIDECAR_SUFFIX, absolute, read_sidecar, resolve_sources
from dataio.loader.which import ids_of_steps
from dataio.plan.types import Segment
from dataio.readers.by_format import make_reader
from dataio.storage.store import StorageOptions, Store


def parse_steps(text: str) -> tuple[int, int]:
    """(first, last) of `A:B` (steps A through B, both included) or `N` (one step); ValueError otherwise."""
    a, sep, b = text.partition(":")
    try:
        first, last = int(a), int(b) if sep else int(a)
    except ValueError:
        raise ValueError(f"--skip-steps {text!r}: expected A:B (optimizer steps A through B) or N") from None
    if not 1 <= first <= last:
        raise ValueError(f"--skip-steps {text!r}: steps start at 1 and A <= B")
    return first, last


def sidecar_covering(stores: Sequence[Store], last: int) -> tuple[dict, str]:
    """(document, URL) of the newest loader-state sidecar in `stores` saved at step >= last: its run
    history holds every step up to `last`. StateError naming the newest step otherwise."""
    newest = None
    for store in stores:
        names = sorted(n for n in (store.list() if store.prefix_exists() else []) if n.endswith(SIDECAR_SUFFIX))
        for name in reversed(names):
            doc = resolve_sources(read_sidecar(store, name), store)
            newest = max(newest or 0, int(doc.get("step", 0)))
            if int(doc.get("step", 0)) >= last:
                return doc, store.url_of(name)
    where = ", ".join(s.url for s in stores)
    raise StateError(f"no checkpoint in {where} was saved at step {last} or later (newest: {newest}): the steps to "
                     "skip must lie before a checkpoint of the run that trained them, whose loader state names them; "
                     "pass their sample keys with --skip-samples instead (spikes.jsonl lists them)")


def ids_of_skipped_steps(stores: Sequence[Store], text: str, urls: Sequence[str],
                         storage: StorageOptions | None = None) -> tuple[np.ndarray, str]:
    """(ids, sidecar URL) of the samples of --skip-steps `text`; `urls` are this loader's sources, in order."""
    first, last = parse_steps(text)
    doc, where = sidecar_covering(stores, last)
    saved = [s["url"] for s in doc["sources"]]
    if saved != [absolute(u, os.getcwd()) for u in urls]:  # (local paths are saved absolute)
        raise StateError(f"{where} was saved by a run reading {saved}, this run reads {list(urls)}: sample ids are "
                         "numbered by the sources in order; skip with the same --data")
    return ids_of_steps(doc, first, last, storage), where


def ids_of_lines(lines: Sequence[str], stores: Sequence[Store], manifests: Sequence[Manifest], *,
                 where: str) -> np.ndarray:
    """Global ids of a --skip-samples file's lines: an integer is an id, anything else a sample key
    (looked up in the shards' indexes, or their keys read); ValueError naming keys not found."""
    ids, keys = [], {}
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.isdigit():
            ids.append(int(text))
        else:
            keys[text] = n
    if keys:
        found = _find_keys(set(keys), stores, manifests)
        missing = [k for k in keys if k not in found]
        if missing:
            raise ValueError(f"{where} line {keys[missing[0]]}: no sample has key {missing[0]!r} in "
                             f"{[s.url for s in stores]} ({len(missing)} keys not found); give keys as `shardify which` "
                             "prints them, or global sample ids")
        ids += found.values()
    return np.asarray(sorted(set(ids)), dtype=np.int64)


def _find_keys(keys: set[str], stores: Sequence[Store], manifests: Sequence[Manifest]) -> dict[str, int]:
    """{key: global id} of the keys found, sources in order (the first source holding a key wins)."""
    found: dict[str, int] = {}
    base = 0
    for store, manifest in zip(stores, manifests):
        reader = make_reader(store, manifest, verify_checksums=True)
        for shard, size in enumerate(manifest.shard_num_samples):
            if size == 0:
                continue
            if hasattr(reader, "index"):  # tar: the index has the keys
                shard_keys = reader.index(shard).columns.keys
            else:
                seg = Segment(shard=shard, start=0, stop=size)
                shard_keys = [str(s["__key__"]) for s in reader.parse(seg, reader.fetch(seg))]
            for i, key in enumerate(shard_keys):
                if key in keys and key not in found:
                    found[key] = base + i
            base += size
        if len(found) == len(keys):
            break
    return found
