"""Where samples come from: an image folder tree, a table (CSV, JSONL, Parquet) or existing tar shards.

A source is scanned once in the parent (`open_source`) into cheap, picklable references
(`Ref`: key, label, location, estimated size); worker processes then turn a shard's refs into
bytes with `Source.load`. No image bytes are read during the scan, so the assignment of samples
to shards is known before any worker starts and does not depend on the number of workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dataio.errors import ShardifyError
from dataio.images import IMAGE_EXTS
from dataio.manifest import Field
from dataio.storage import Store, redact

TABLE_EXTS = (".csv", ".jsonl", ".ndjson", ".parquet", ".pq")


class SourceError(ShardifyError):
    """The source of `shardify write` is missing, empty or not what the options say."""


@dataclass(frozen=True, slots=True)
class Ref:
    """One sample before loading: `loc` is a file path (folder), a row number (table) or tar members."""

    key: str
    label: int | None
    loc: Any
    size_bytes: int
    num_members: int = 2


@dataclass(slots=True)
class RawSample:
    """One loaded sample: image bytes and extension (or None), label, and other fields by name."""

    key: str
    label: int | None
    image_ext: str | None
    image: bytes | None
    extras: dict[str, Any]
    where: str


@dataclass(kw_only=True)
class Source:
    """A scanned source: refs in source order, label names, the fields samples will carry."""

    description: str
    refs: list[Ref]
    label_names: tuple[str, ...] | None
    image_exts: tuple[str, ...]
    extra_fields: tuple[Field, ...] = ()
    has_labels: bool = True

    def __getstate__(self) -> dict[str, Any]:
        # A worker gets its shard's refs separately: never pickle every ref (or a table) per task.
        state = dict(self.__dict__)
        state["refs"] = []
        if "_table" in state:
            state["_table"] = None
        return state

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        """Yield each ref with its sample, or the exception that loading it raised."""
        raise NotImplementedError


def normalize_ext(ext: str) -> str:
    ext = ext.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ("tif" if ext == "tiff" else ext)


def key_width(n: int) -> int:
    return max(6, len(str(max(n - 1, 0))))


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- image folder


@dataclass(kw_only=True)
class FolderSource(Source):
    root: str

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        for ref in refs:
            path = os.path.join(self.root, ref.loc)
            try:
                data = read_file(path)
            except OSError as exc:
                yield ref, SourceError(f"{path}: cannot read ({exc.strerror or exc})")
                continue
            ext = normalize_ext(os.path.splitext(ref.loc)[1])
            yield ref, RawSample(ref.key, ref.label, ext, data, {}, path)


def _scan_images(directory: str) -> list[tuple[str, int]]:
    """(path relative to `directory`, size) of every image file below it, sorted; follows ImageFolder."""
    found: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith(".") or normalize_ext(os.path.splitext(name)[1]) not in IMAGE_EXT_SET:
                continue
            full = os.path.join(dirpath, name)
            try:
                size = os.stat(full).st_size
            except OSError:
                size = 0  # unreadable: load() reports it, per --on-error
            found.append((os.path.relpath(full, directory), size))
    return sorted(found)


IMAGE_EXT_SET = {normalize_ext(e) for e in IMAGE_EXTS}


def open_folder(root: str) -> FolderSource:
    """ImageFolder layout: ROOT/CLASS/.../IMAGE; labels index the sorted class folder names."""
    classes = sorted(
        e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")
    )
    if not classes:
        raise SourceError(
            f"{root}: no class folders found; an image folder source must look like "
            "ROOT/CLASS_NAME/IMAGE.jpg (one subfolder per class)"
        )
    items: list[tuple[str, int, int]] = []
    for label, name in enumerate(classes):
        items += [(os.path.join(name, rel), size, label) for rel, size in _scan_images(os.path.join(root, name))]
    if not items:
        raise SourceError(
            f"{root}: the class folders {classes[:5]} hold no images with extensions {sorted(IMAGE_EXT_SET)}; "
            "put the images in ROOT/CLASS_NAME/"
        )
    width = key_width(len(items))
    refs = [Ref(f"{i:0{width}d}", label, rel, size) for i, (rel, size, label) in enumerate(items)]
    exts = tuple(sorted({normalize_ext(os.path.splitext(rel)[1]) for rel, _, _ in items}))
    return FolderSource(description=root, refs=refs, label_names=tuple(classes), image_exts=exts, root=root)


# ---------------------------------------------------------------- dispatch


def open_source(
    src: str, *, storage: Any = None, image_column: str | None = None, label_column: str | None = None,
    key_column: str | None = None,
) -> Source:
    """Scan SRC: a brace pattern / .tar / directory of .tar (re-shard), a table file, or an image folder."""
    from sharding.table_source import open_table
    from sharding.tar_source import expand_braces, open_dataset, open_tars

    shown = redact(src, storage.secrets if storage else ())
    if "{" in src or src.endswith(".tar"):
        paths = expand_braces(src)
        parent = os.path.dirname(paths[0]) or "."
        store = Store(parent, storage)
        names = [p[len(parent) + 1 :] if p.startswith(parent + "/") else os.path.basename(p) for p in paths]
        missing = [n for n in names if not store.exists(n)]
        if missing:
            raise SourceError(f"{shown}: source shard(s) {missing[:3]} do not exist; check the path or pattern")
        return open_tars(store, names, shown)
    if "://" not in src or src.startswith("file://"):
        path = src.removeprefix("file://")
        if not os.path.exists(path):
            raise SourceError(f"{path}: the source does not exist; give an image folder, a table or tar shards")
        if os.path.isfile(path):
            if not path.lower().endswith(TABLE_EXTS):
                raise SourceError(f"{path}: not a table ({', '.join(TABLE_EXTS)}) nor a .tar shard")
            return open_table(path, image_column=image_column, label_column=label_column, key_column=key_column)
        if os.path.isfile(os.path.join(path, "manifest.json")):
            return open_dataset(Store(path, storage), shown)
        tars = sorted(e.name for e in os.scandir(path) if e.is_file() and e.name.endswith(".tar"))
        if tars:
            return open_tars(Store(path, storage), tars, shown)
        return open_folder(path)
    store = Store(src, storage)
    if store.exists("manifest.json"):
        return open_dataset(store, shown)
    tars = [n for n in store.list() if n.endswith(".tar") and "/" not in n]
    if not tars:
        raise SourceError(f"{shown}: no .tar shards found there; remote sources must be WebDataset tar shards")
    return open_tars(store, tars, shown)


def extras_json(extras: dict[str, Any]) -> bytes:
    """Table values of one sample as the KEY.json member (bytes values travel as their own members)."""
    return json.dumps({k: v for k, v in extras.items() if not isinstance(v, bytes)}, default=str).encode()
