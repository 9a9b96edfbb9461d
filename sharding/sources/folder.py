"""An image folder source: ROOT/CLASS/.../IMAGE, labels from the sorted class folder names (ImageFolder)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sharding.sources.base import (
    IMAGE_EXT_SET,
    RawSample,
    Ref,
    Source,
    SourceError,
    key_width,
    normalize_ext,
    read_file,
)


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
