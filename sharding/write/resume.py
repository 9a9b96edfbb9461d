"""`shardify write --resume` and `shardify append`, on the dataset versions of dataio.format.versions.

Resume: the newest write of DEST that never published (journal state writing or failed) is
continued in its own version: every shard its journal lists as confirmed, and still present, is
kept; only the others are written. The plan depends on the source and options alone, so the
shards are the ones an uninterrupted run would have written. The journal's fingerprint (source
keys and sizes, write options) must match, or the resume is refused naming what changed.

Append: new samples become new shards of a new version (`shards/v00000g/`), and a new manifest
naming the old shards and the new ones replaces the old manifest atomically; loaders that opened
the old one keep reading the old shards (gc keeps them: the new manifest names them too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dataio.format.manifest import Manifest, read_manifest
from dataio.format.versions import (
    JournalHead,
    generation_of,
    journal_versions,
    next_generation,
    read_journal,
)
from dataio.storage.store import Store
from sharding.sources.base import Source, SourceError
from sharding.write.config import Layout, ShardResult, ShardTask


def _result(row: dict[str, Any]) -> ShardResult:
    """A journal row (JSON) back into the ShardResult it was written from."""
    row = dict(row)
    for key in ("row_groups", "row_group_checksums"):
        if row.get(key) is not None:
            row[key] = tuple(row[key])
    row["skipped"] = tuple(dict(s) for s in row.get("skipped") or ())
    if row.get("dropped"):
        row["dropped"] = tuple((str(k), int(n)) for k, n in row["dropped"])
    return ShardResult(**row)


def resume_point(
    dest: Store, expected: Callable[[int], JournalHead], tasks_of: Callable[[int], list[ShardTask]],
) -> tuple[int, JournalHead, dict[int, ShardResult], int]:
    """(generation, journal head, confirmed results by shard number, journal batches so far) of the
    write to resume; SourceError when there is none or its source or options differ."""
    listing = dest.list()
    versions = journal_versions(listing)
    heads = {v: read_journal(dest, v, []) for v in versions}  # heads only: rows of the one resumed below
    unpublished = [v for v in versions if heads[v][0].state != "published"]
    if not unpublished:
        raise SourceError(f"{dest.url}: no interrupted write to resume (no journal in state writing or failed); "
                          "run `shardify write` without --resume")
    version = unpublished[-1]
    newer = [v for v in versions if generation_of(v) > generation_of(version) and heads[v][0].state == "published"]
    if newer:
        raise SourceError(f"{dest.url}: the interrupted write {version} was superseded by the published {newer[-1]}; "
                          "nothing to resume")
    head, rows = read_journal(dest, version, listing)
    generation = generation_of(version)
    mine = expected(generation)
    if mine.fingerprint != head.fingerprint:
        changed = sorted(k for k in set(head.options) | set(mine.options) if head.options.get(k) != mine.options.get(k))
        what = f"the write options {changed}" if changed else f"the source ({head.source}: its samples' keys or sizes)"
        raise SourceError(
            f"{dest.url}: cannot resume {version}: {what} changed since it started (journal fingerprint "
            f"{head.fingerprint}, now {mine.fingerprint}); rerun with the same SRC and options, or start a new "
            "version with --overwrite instead of --resume"
        )
    present = set(listing)
    planned = {t.index: t.path for t in tasks_of(generation)}
    done: dict[int, ShardResult] = {}
    for row in rows:
        result = _result(row)
        if planned.get(result.index) == result.path and result.path in present \
                and (result.index_path is None or result.index_path in present):
            done[result.index] = result
    num_batches = sum(1 for p in listing if p.startswith(f"versions/{version}/shards-"))
    return generation, dataclasses.replace(head, state="writing", error=""), done, num_batches


def check_append(manifest: Manifest, source: Source, layout: Layout, where: str) -> dict[int, int] | None:
    """The label remapping of an append (source label -> dataset label), None if none is needed;
    SourceError naming the difference when the fields or label names do not fit the dataset."""
    fields = set(layout.fields(manifest.format))
    have = set(manifest.fields)
    extra = sorted(f"{f.name}:{f.type}" for f in fields - have)
    if extra:
        raise SourceError(
            f"{where}: the new samples have fields {extra} that the dataset does not "
            f"({sorted(f'{f.name}:{f.type}' for f in have)}); append only samples of the same fields, or write a "
            "new dataset"
        )
    old, new = manifest.label_names, source.label_names
    if old is None and new is None:
        return None
    if old is None or new is None:
        raise SourceError(f"{where}: the dataset has label names {old} but the new samples {new}; append samples "
                          "labelled the same way")
    missing = [n for n in new if n not in old]
    if missing:
        raise SourceError(f"{where}: label names {missing} are not among the dataset's {list(old)}; append only "
                          "samples of the dataset's classes, or write a new dataset")
    mapping = {i: old.index(n) for i, n in enumerate(new)}
    return None if all(i == j for i, j in mapping.items()) else mapping


def appended_layout(manifest: Manifest, layout: Layout) -> Layout:
    """The layout new shards are written with: a Parquet dataset keeps its one schema."""
    if manifest.format != "parquet":
        return layout
    image = tuple(f.name for f in manifest.fields if f.type == "image")
    extra = tuple(f for f in manifest.fields if f.type != "image" and f.name != "cls")
    return Layout(image_exts=image, has_labels="cls" in manifest.field_names, extra_fields=extra)


def appended_source(source: Source, manifest: Manifest, mapping: dict[int, int] | None) -> Source:
    """The source with labels mapped to the dataset's and scan-number keys continued after its samples."""
    offset = manifest.num_samples
    numeric = all(r.key.isdigit() for r in source.refs)
    width = max(6, len(str(offset + len(source.refs) - 1)))
    refs = [dataclasses.replace(
        r, label=mapping.get(r.label, r.label) if mapping and r.label is not None else r.label,
        key=f"{offset + int(r.key):0{width}d}" if numeric else r.key) for r in source.refs]
    copy = dataclasses.replace(source, refs=refs, label_names=manifest.label_names)
    return copy


def appended_manifest(old: Manifest, new: Manifest) -> Manifest:
    """The old dataset's shards, then the new ones; the dataset's fields and label names."""
    tar = old.format == "tar"

    def both(name: str) -> tuple:
        return tuple(getattr(old, name)) + tuple(getattr(new, name))  # tuple(): a parted column reads its parts

    return dataclasses.replace(
        new, fields=old.fields, label_names=old.label_names,
        shard_paths=both("shard_paths"), shard_num_samples=both("shard_num_samples"),
        shard_num_bytes=both("shard_num_bytes"), shard_checksums=both("shard_checksums"),
        index_paths=both("index_paths") if tar else (), index_num_bytes=both("index_num_bytes") if tar else (),
        index_checksums=both("index_checksums") if tar else (), row_groups=() if tar else both("row_groups"),
        **_both_read_checksums(old, new),
        source=f"{old.source} + {new.source}", skipped=both("skipped"),
        _fingerprint=[], parted=None,
    )


def _both_read_checksums(old: Manifest, new: Manifest) -> dict[str, tuple]:
    """The old and new shards' read-granularity checksums; a dataset written before them (manifest
    version 1 or 2) gives its shards empty entries: they stay unverified, the new ones are checked."""
    name = "sums_checksums" if old.format == "tar" else "row_group_checksums"
    empty: Any = "" if old.format == "tar" else ()

    def column(m: Manifest) -> tuple:
        return tuple(getattr(m, name)) if m.has_read_checksums else (empty,) * m.num_shards

    return {name: column(old) + column(new)}


def open_for_append(dest: Store) -> tuple[Manifest, int]:
    """The dataset's current manifest and the generation the append writes."""
    manifest = read_manifest(dest)
    listing = dest.list()
    return manifest, next_generation(listing, journal_versions(listing))

