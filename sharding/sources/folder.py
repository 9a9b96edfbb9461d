"""An image folder source: ROOT/CLASS/.../IMAGE, labels from the sorted class folder names (ImageFolder)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dataio.errors import ShardifyError
from dataio.storage.store import Store, redact
from sharding.sources.base import (
    IMAGE_EXT_SET,
    RawSample,
    Ref,
    SampleLoadError,
    Source,
    SourceError,
    key_width,
    normalize_ext,
    path_keys,
)
from sharding.sources.remote import RemoteFiles, is_url, list_sizes


@dataclass(kw_only=True)
class FolderSource(Source):
    root: str  # a local directory or a URL prefix (s3://bucket/raw-images)
    storage: Any = None

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        files = RemoteFiles(self.storage)

        def one(ref: Ref) -> RawSample | Exception:
            path = f"{self.root}/{ref.loc}" if is_url(self.root) else os.path.join(self.root, ref.loc)
            try:
                data = files.read(path)
            except OSError as exc:
                return SampleLoadError(f"{path}: cannot read ({exc.strerror or exc})", where=path)
            except ShardifyError as exc:
                return SampleLoadError(str(exc), where=path)
            ext = normalize_ext(os.path.splitext(ref.loc)[1])
            return RawSample(ref.key, ref.label, ext, data, {}, path, origin=ref.loc)

        yield from zip(refs, files.map(one, list(refs)))


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


def open_folder(root: str, *, key: str = "index", storage: Any = None) -> FolderSource:
    """ImageFolder layout: ROOT/CLASS/.../IMAGE (a directory or a URL prefix); labels index the
    sorted class folder names. Keys are scan numbers (`000042`), or with key="path" the relative
    paths (see path_keys)."""
    if is_url(root):
        classes, items = _scan_remote(root, storage)
    else:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        items = []
        for label, name in enumerate(classes):
            items += [(os.path.join(name, rel), size, label) for rel, size in _scan_images(os.path.join(root, name))]
    if not classes:
        raise SourceError(
            f"{redact(root)}: no class folders found; an image folder source must look like "
            "ROOT/CLASS_NAME/IMAGE.jpg (one subfolder per class)"
        )
    if not items:
        raise SourceError(
            f"{redact(root)}: the class folders {classes[:5]} hold no images with extensions {sorted(IMAGE_EXT_SET)}; "
            "put the images in ROOT/CLASS_NAME/"
        )
    width = key_width(len(items))
    keys = path_keys([rel for rel, _, _ in items]) if key == "path" else [f"{i:0{width}d}" for i in range(len(items))]
    refs = [Ref(k, label, rel, size) for k, (rel, size, label) in zip(keys, items)]
    exts = tuple(sorted({normalize_ext(os.path.splitext(rel)[1]) for rel, _, _ in items}))
    return FolderSource(description=redact(root), refs=refs, label_names=tuple(classes), image_exts=exts,
                        root=root.rstrip("/"), storage=storage)


def _is_image(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return not name.startswith(".") and normalize_ext(os.path.splitext(name)[1]) in IMAGE_EXT_SET


def _scan_remote(root: str, storage: Any) -> tuple[list[str], list[tuple[str, int, int]]]:
    """(class names, (relative path, size, label) of every image) of a URL prefix, each class listed
    on its own thread with the loader's retry policy."""
    store = Store(root, storage)
    classes = sorted({rel.split("/", 1)[0] for rel, _ in list_sizes(store, "", recursive=False, dirs=True)})
    classes = [c for c in classes if not c.startswith(".")]

    def list_class(name: str) -> list[tuple[str, int]]:
        return sorted((f"{name}/{rel}", size) for rel, size in list_sizes(store, name) if _is_image(rel))

    items = [(rel, size, label) for label, listed in enumerate(RemoteFiles(storage).map(list_class, classes))
             for rel, size in listed]
    return classes, items
