"""Existing WebDataset tar shards (ShardWriter's, or a shardify dataset's) as a source to re-shard."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dataio.decode.images import IMAGE_FIELD_ORDER
from dataio.format.manifest import Field
from dataio.format.tar_index import build_index
from dataio.storage.store import Store
from sharding.sources.base import (
    IMAGE_EXT_SET,
    RawSample,
    Ref,
    SampleLoadError,
    Source,
    SourceError,
    normalize_ext,
)
from sharding.sources.compressed import Decompressed, is_compressed_tar, plain_name


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace patterns: `a-{000..009}.tar`, `{a,b}.tar` (nested allowed)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = rng.group(1), rng.group(2)
        width = len(lo) if lo.startswith("0") else 0
        items = [f"{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
    else:
        items = body.split(",")
    return [out for item in items for out in expand_braces(head + item + tail)]


@dataclass(kw_only=True)
class TarSource(Source):
    store: Store
    names: tuple[str, ...]
    # Where messages and sample origins say the shards are, where they differ from where they are
    # read (compressed shards read from their decompressed copies: compressed.py).
    urls: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()

    def url_of_shard(self, shard: int) -> str:
        return self.urls[shard] if self.urls else self.store.url_of(self.names[shard])

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        handles: dict[int, Any] = {}
        try:
            for ref in refs:
                shard, members = ref.loc
                where = self.url_of_shard(shard)
                try:
                    f = handles.get(shard)
                    if f is None:
                        f = handles[shard] = self.store.fs.open(self.store.path(self.names[shard]), "rb")
                    fields: dict[str, bytes] = {}
                    for ext, offset, size in members:
                        f.seek(offset)
                        fields[ext] = f.read(size)
                except OSError as exc:
                    yield ref, SourceError(f"{where}: sample {ref.key!r}: cannot read ({exc})")
                    continue
                image_ext = min((e for e in fields if _is_image_ext(e)), key=_image_rank, default=None)
                image = fields.pop(image_ext) if image_ext else None
                if image is None and self.image_exts:
                    yield ref, SampleLoadError(
                        f"{where}: sample {ref.key!r} has no image member (it has {sorted(fields)}) while the "
                        "source's other samples have one; add its image", where=f"{where}#{ref.key}")
                    continue
                fields.pop(label_ext(fields) or "cls", None)
                yield ref, RawSample(ref.key, ref.label, image_ext, image, fields, f"{where} sample {ref.key}",
                                     origin=f"{(self.origins or self.names)[shard]}#{ref.key}")
        finally:
            for f in handles.values():
                f.close()


def _is_image_ext(ext: str) -> bool:
    """`jpg`, and also WebDataset's compound extensions such as `img.jpg` or `left.png`."""
    return normalize_ext(ext.rsplit(".", 1)[-1]) in IMAGE_EXT_SET


def _image_rank(ext: str) -> int:
    """A sample with several image members keeps the first in IMAGE_FIELD_ORDER as its image."""
    last = ext.rsplit(".", 1)[-1].lower()
    return IMAGE_FIELD_ORDER.index(last) if last in IMAGE_FIELD_ORDER else len(IMAGE_FIELD_ORDER)


def label_ext(exts: Any) -> str | None:
    """The member holding a sample's label: `cls`, else its one compound `X.cls` (a key with dots,
    `a.b.c.jpg` + `a.b.c.cls`, is key `a` with members `b.c.jpg` and `b.c.cls`, as WebDataset splits)."""
    exts = list(exts)
    if "cls" in exts:
        return "cls"
    compound = [e for e in exts if e.lower().endswith(".cls")]
    return compound[0] if len(compound) == 1 else None


def _tar_label(url: str, handle: Any, members: dict[str, tuple[int, int]], key: str) -> int | None:
    ext = label_ext(members)
    if ext is None:
        return None
    offset, size = members[ext]
    handle.seek(offset)
    text = handle.read(size).decode(errors="replace").strip()
    try:
        return int(text)
    except ValueError:
        raise SourceError(f"{url}: sample {key!r}: .{ext} holds {text[:20]!r}, not an integer label; "
                          "write integer class numbers in .cls members") from None


def _grouped(index: Any, url: str) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """(key, {ext: (offset, size)}) per sample, in order of first appearance. Members of one key are
    gathered even when not consecutive (`tar cf s.tar *.jpg *.cls` puts every image first); a key
    with the same extension twice is refused: its samples cannot be told apart."""
    samples: dict[str, dict[str, tuple[int, int]]] = {}
    for sample in index.samples:
        members = samples.setdefault(sample.key, {})
        for m in sample.members:
            if m.ext in members:
                raise SourceError(f"{url}: sample key {sample.key!r} has two {m.ext!r} members in this shard; its "
                                  "samples cannot be told apart: give each sample its own key")
            members[m.ext] = (m.offset, m.size)
    return list(samples.items())


def open_tars(store: Store, names: list[str], description: str, *, log: Callable[[str], None] | None = None) -> TarSource:
    """Existing WebDataset tar shards, indexed with dataio.format.tar_index.build_index (labels from .cls);
    compressed ones (.tar.gz, ...) are read from plain copies in a temporary folder (compressed.py)."""
    urls, origins, copies = [store.url_of(n) for n in names], list(names), None
    if any(is_compressed_tar(n) for n in names):
        copies = Decompressed(store, names, log=log)
        store, names = copies.store, copies.names
    refs: list[Ref] = []
    exts: set[str] = set()
    extra: dict[str, None] = {}
    full_keys: list[str] = []  # as in the tar, directories included
    for shard, name in enumerate(names):
        url = urls[shard]
        with store.fs.open(store.path(name), "rb") as f:
            for key, members in _grouped(build_index(f, url=url), url):
                label = _tar_label(url, f, members, key)
                image = sorted((e for e in members if _is_image_ext(e)), key=_image_rank)[:1]
                exts.update(image)
                extra.update((e, None) for e in members if e not in image and e != label_ext(members))
                size = sum(s for _, s in members.values())
                locs = tuple((e, o, s) for e, (o, s) in members.items())
                refs.append(Ref(key.rsplit("/", 1)[-1], label, (shard, locs), size, len(members)))
                full_keys.append(key)
    if not refs:
        raise SourceError(f"{description}: the tar shards hold no samples")
    refs = _unique_keys(refs, full_keys, [plain_name(o) for o in origins])
    has_labels = any(r.label is not None for r in refs)
    extra_fields = tuple(Field(name=e, type="json" if e == "json" else "bytes") for e in extra)
    source = TarSource(
        description=description, refs=refs, label_names=None, image_exts=tuple(sorted(exts)),
        extra_fields=extra_fields, has_labels=has_labels, store=store, names=tuple(names),
        urls=tuple(urls) if copies else (), origins=tuple(origins) if copies else (),
    )
    if copies is not None:
        copies.keep_alive(source)  # the copies go when the source does
    return source


def _unique_keys(refs: list[Ref], full_keys: list[str], names: Sequence[str]) -> list[Ref]:
    """Keys as they are (without directories) when unique across the shards; else each made unique
    by its path: shard path and key as in the tar (`a/shard-000000/000123`: tars of the same name in
    two directories often number their samples alike)."""
    keys = [r.key for r in refs]
    if len(set(keys)) == len(keys):
        return refs
    stems = [re.sub(r"[^A-Za-z0-9_/-]", "_", n.removesuffix(".tar")).strip("/") for n in names]
    out = [replace(r, key=f"{stems[r.loc[0]]}/{re.sub(r'[^A-Za-z0-9_/-]', '_', full)}")
           for r, full in zip(refs, full_keys)]
    if len({r.key for r in out}) != len(out):
        raise SourceError("sample keys repeat within the source shards even with their shard paths; "
                          "re-shard them separately")
    return out


def open_dataset(store: Store, description: str) -> TarSource:
    """A shardify tar dataset (its manifest's shards, label names kept) as a source to re-shard."""
    from dataio.format.manifest import read_manifest

    manifest = read_manifest(store)
    if manifest.format != "tar":
        raise SourceError(f"{description}: re-sharding a {manifest.format} dataset is not supported; use its tar twin or source")
    source = open_tars(store, list(manifest.shard_paths), description)
    source.label_names = manifest.label_names
    return source

