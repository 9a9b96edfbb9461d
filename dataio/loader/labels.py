"""One label space for the sources a loader reads (a single dataset is a mixture of one).

Each source's manifest may name its labels (`label_names`: index -> name). The loader gives its
batches one label space, chosen by `label_space`:

- "same" (default): the sources' names must agree at every index they both name (one may name
  more classes than another); the space is the longest list. Names that differ are refused,
  naming both sets, since merging them by index would silently mislabel.
- "union": merged by name into the sorted union of every source's names; each source's labels
  are remapped to it.
- a mapping, {source: {name: index}} (source: its URL or the last part of its path) or
  {name: index} for every source: an explicit space; a source without names is mapped by its
  integer labels written as strings ("0", "1", ...).

Every real sample's label is checked against its own source's names (never another source's),
and remapped by one lookup tensor per source. A leaf of the loader package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dataio.errors import CorruptSampleError, ManifestError
from dataio.format.manifest import Manifest

UNMAPPED = -2  # in a lookup table: an own label the explicit map does not name
UNCHECKED = 1 << 62  # the label limit of a source that names no labels and has no map
FIX_NAMES = ("pass label_space='union' (trainer: --label-space union) to merge them by name into their "
             "sorted union, or an explicit map {source: {name: index}} (trainer: --label-map FILE.json)")


@dataclass(frozen=True, kw_only=True)
class SourceLabels:
    """One source as the label space sees it: its URL (redacted), its store and manifest."""

    url: str
    given: str  # the URL as the caller gave it (may hold credentials: matched, never shown)
    store: Any
    manifest: Manifest


@dataclass(frozen=True, kw_only=True)
class LabelSpace:
    """The batches' label names and, per source, how its own labels map into them."""

    names: tuple[str, ...] | None  # index -> name of the space; None: no source names its labels
    sources: tuple[SourceLabels, ...]
    own_counts: tuple[int | None, ...]  # per source: how many labels its manifest names (None: unnamed)
    tables: tuple[torch.Tensor | None, ...]  # per source: own label -> space label, int64; None: the same
    _limits: torch.Tensor = field(init=False, repr=False)  # [num sources] int64
    _offsets: torch.Tensor = field(init=False, repr=False)  # [num sources] int64
    _lut: torch.Tensor | None = field(init=False, repr=False)  # [sum of the tables' lengths] int64

    @property
    def num_classes(self) -> int | None:
        return None if self.names is None else len(self.names)

    @property
    def remaps(self) -> bool:
        return any(t is not None for t in self.tables)

    def describe(self) -> list[Any]:
        """What identifies the space (for checkpoints): its names and each source's table."""
        return [list(self.names or ()), [None if t is None else t.tolist() for t in self.tables]]

    def __post_init__(self) -> None:
        # One lookup for all sources: source s's own label y sits at lut[offsets[s] + y] (offsets -1:
        # no table); limits[s] is how many labels s has (unnamed, unmapped: unchecked here).
        limits, offsets, parts, size = [], [], [], 0
        for count, table in zip(self.own_counts, self.tables):
            full = table if table is not None else (torch.arange(count) if count is not None else None)
            limits.append(len(full) if full is not None else UNCHECKED)
            offsets.append(size if full is not None else -1)
            parts += [full] if full is not None else []
            size += len(full) if full is not None else 0
        object.__setattr__(self, "_limits", torch.tensor(limits, dtype=torch.int64))
        object.__setattr__(self, "_offsets", torch.tensor(offsets, dtype=torch.int64))
        object.__setattr__(self, "_lut", torch.cat(parts).to(torch.int64) if parts and self.remaps else None)

    def apply(self, batch: Any) -> Any:
        """The batch with every real sample's label checked against its own source and mapped into
        the space (a new "label" tensor; the batch's own is never written). Non-dict batches pass."""
        if not isinstance(batch, dict) or not isinstance(batch.get("label"), torch.Tensor):
            return batch
        labels = batch["label"]  # int64 [N]; -1: a sample without a label (kept as it is)
        source = batch.get("source")
        source = source if isinstance(source, torch.Tensor) else torch.zeros_like(labels)
        mask = batch.get("mask")
        real = mask if isinstance(mask, torch.Tensor) else torch.ones_like(labels, dtype=torch.bool)
        bad = real & ((labels < -1) | (labels >= self._limits[source]))
        if self._lut is None:
            self._refuse_first(batch, bad, labels, source)
            return batch
        mapped_from = (self._offsets[source] >= 0) & (labels >= 0)
        index = (self._offsets[source] + labels.clamp(min=0)).clamp(0, len(self._lut) - 1)
        looked_up = self._lut[index]  # [N]; meaningful where mapped_from and not bad
        self._refuse_first(batch, bad | (real & mapped_from & (looked_up == UNMAPPED)), labels, source)
        mapped = torch.where(mapped_from, looked_up, labels)
        batch["label"] = mapped.pin_memory() if labels.is_pinned() else mapped  # pin_memory=True stays true
        return batch

    def _refuse_first(self, batch: dict[str, Any], bad: torch.Tensor, labels: torch.Tensor,
                      source: torch.Tensor) -> None:
        """CorruptSampleError for the first real sample whose label its own source does not name."""
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            self._refuse(batch, i, int(source[i]), int(labels[i]))

    def _refuse(self, batch: dict[str, Any], i: int, s: int, label: int) -> None:
        src = self.sources[s]
        key = str(batch["__key__"][i]) if "__key__" in batch else "?"
        shards = batch.get("__shard__")
        url = src.url
        if isinstance(shards, torch.Tensor):
            url = src.store.url_of(src.manifest.shard_paths[int(shards[i])])
        count = self.own_counts[s]
        if count is not None:
            known = f"its manifest names {count} labels (0..{count - 1}: {shown(src.manifest.label_names)})"
            fix = "fix the sample's label and rewrite the shard, or name every label (shardify write --label-names)"
        else:
            known = "the label map names no such label for this source"
            fix = "add it to the label map"
        raise CorruptSampleError(f"{url}: sample {key!r} of source {s + 1} ({src.url}) has label {label}, but "
                                 f"{known}; {fix}", url=url, key=key)


def shown(names: Sequence[str] | None, limit: int = 12) -> str:
    """A list of label names for a message, cut after `limit`."""
    if not names:
        return "none"
    head = ", ".join(names[:limit])
    return head + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def build_label_space(sources: Sequence[SourceLabels], label_space: str | Mapping[str, Any]) -> LabelSpace:
    """The label space of these sources (in order), or ManifestError naming what does not fit."""
    counts = tuple(None if s.manifest.label_names is None else len(s.manifest.label_names) for s in sources)
    if isinstance(label_space, Mapping):
        names, tables = mapped_space(sources, label_space)
    elif label_space == "union":
        names, tables = union_space(sources)
    else:
        names, tables = same_space(sources), (None,) * len(sources)
    return LabelSpace(names=names, sources=tuple(sources), own_counts=counts, tables=tables)


def same_space(sources: Sequence[SourceLabels]) -> tuple[str, ...] | None:
    """The longest of the sources' label names, when all agree wherever two name the same index."""
    named = [(s, tuple(s.manifest.label_names)) for s in sources if s.manifest.label_names is not None]
    if not named:
        return None
    longest_src, longest = max(named, key=lambda item: len(item[1]))
    for src, names in named:
        differ = [i for i, n in enumerate(names) if longest[i] != n]
        if differ:
            i = differ[0]
            raise ManifestError(
                f"the mixed sources name their labels differently: {longest_src.url} names [{shown(longest)}] "
                f"and {src.url} names [{shown(names)}] (label {i}: {longest[i]!r} vs {names[i]!r}); merged by "
                f"index they would mislabel. {FIX_NAMES[0].upper()}{FIX_NAMES[1:]}")
    return longest


def union_space(sources: Sequence[SourceLabels]) -> tuple[tuple[str, ...], tuple[torch.Tensor | None, ...]]:
    """The sorted union of every source's label names, and each source's table into it."""
    for s in sources:
        if s.manifest.label_names is None:
            raise ManifestError(f"{s.url}: label_space='union' merges the sources' labels by name, but this "
                                "source names none; name them (shardify write --label-names A,B,...) or give "
                                "an explicit label map with its integer labels as keys (\"0\", \"1\", ...)")
    names = tuple(sorted({n for s in sources for n in s.manifest.label_names or ()}))
    index = {n: i for i, n in enumerate(names)}
    tables = tuple(identity_or(torch.tensor([index[n] for n in s.manifest.label_names or ()], dtype=torch.int64))
                   for s in sources)
    return names, tables


def identity_or(table: torch.Tensor) -> torch.Tensor | None:
    """None for a table that maps every label to itself (nothing to remap)."""
    return None if torch.equal(table, torch.arange(len(table))) else table


def mapped_space(sources: Sequence[SourceLabels], label_map: Mapping[str, Any]
                 ) -> tuple[tuple[str, ...], tuple[torch.Tensor | None, ...]]:
    """The space an explicit map gives: per source {own name: index}; names by index (the first
    name mapped to each index, or the index itself where none is)."""
    per_source, flat = maps_per_source(sources, label_map)
    size = 1 + max((i for m in per_source for i in m.values()), default=-1)
    space: list[str | None] = [None] * size
    tables = []
    for src, own_map in zip(sources, per_source):
        own = src.manifest.label_names
        if own is None:
            keys = [k for k in own_map if not k.isdigit()]
            if keys:
                raise ManifestError(f"{src.url} names no labels, so its label map takes its integer labels as "
                                    f"keys (\"0\", \"1\", ...), got {keys[:5]}")
            own = tuple(str(i) for i in range(1 + max((int(k) for k in own_map), default=-1)))
        missing = [n for n in own if n not in own_map] if src.manifest.label_names is not None else []
        if missing:
            raise ManifestError(f"the label map leaves out labels of {src.url}: [{shown(missing)}]; map every "
                                f"one of its names [{shown(own)}] to an index")
        extra = [n for n in own_map if n not in own] if not flat else []
        if extra:
            raise ManifestError(f"the label map names [{shown(extra)}] for {src.url}, which has no such labels "
                                f"(its names: [{shown(own)}])")
        for name in own:
            if name in own_map and space[own_map[name]] is None:
                space[own_map[name]] = name
        table = torch.tensor([own_map.get(n, UNMAPPED) for n in own], dtype=torch.int64)
        tables.append(table if src.manifest.label_names is None else identity_or(table))
    return tuple(n if n is not None else str(i) for i, n in enumerate(space)), tuple(tables)


def maps_per_source(sources: Sequence[SourceLabels], label_map: Mapping[str, Any]
                    ) -> tuple[list[dict[str, int]], bool]:
    """Each source's {name: index} from a map keyed by source, or one flat map for all of them
    (then True: a flat map may name labels a source lacks)."""
    if label_map and all(isinstance(v, int) and not isinstance(v, bool) for v in label_map.values()):
        unnamed = [s.url for s in sources if s.manifest.label_names is None]
        if unnamed:
            raise ManifestError(f"a flat label map maps label names, but {unnamed} name none; key the map by "
                                "source, with such a source's integer labels as keys (\"0\", \"1\", ...)")
        return [checked_map("the label map", label_map)] * len(sources), True
    found: list[dict[str, int] | None] = [None] * len(sources)
    for key, value in label_map.items():
        hits = [i for i, s in enumerate(sources) if key in (s.given, s.url, dataset_name(s.given))]
        if len(hits) != 1:
            raise ManifestError(
                f"label map key {key!r} names {'no' if not hits else 'more than one'} source; key each source by "
                f"its URL or the last part of its path: {[dataset_name(s.url) for s in sources]}")
        if not isinstance(value, Mapping):
            raise ManifestError(f"label map entry {key!r} must map label names to indices, got {value!r}")
        found[hits[0]] = checked_map(f"label map entry {key!r}", value)
    absent = [s.url for s, m in zip(sources, found) if m is None]
    if absent:
        raise ManifestError(f"the label map has no entry for {absent}; give every source one (keyed by its URL "
                            f"or the last part of its path), or one flat {{name: index}} map for all")
    return [m for m in found if m is not None], False


def checked_map(what: str, value: Mapping[str, Any]) -> dict[str, int]:
    """{name: index} with names as strings and indices ints >= 0, else ManifestError naming `what`."""
    bad = {k: v for k, v in value.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
    if bad or not value:
        raise ManifestError(f"{what} must map label names to integer indices >= 0, got {dict(value)!r}")
    return {str(k): int(v) for k, v in value.items()}


def dataset_name(url: str) -> str:
    """The last part of a dataset URL's path (s3://b/sets/flowers/ -> flowers)."""
    return url.rstrip("/").rsplit("/", 1)[-1]
