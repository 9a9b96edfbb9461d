"""The chooser: which source a `shardify write` SRC argument is (tars, a table, a dataset, an image folder)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from dataio.errors import ShardifyError
from dataio.storage.store import Store, redact
from sharding.sources.base import (
    IMAGE_EXT_SET,
    TABLE_EXTS,
    Source,
    SourceError,
    normalize_ext,
)
from sharding.sources.compressed import is_compressed_tar
from sharding.sources.folder import open_folder
from sharding.sources.table import open_table
from sharding.sources.tar import expand_braces, open_dataset, open_tars
from sharding.sources.text import is_text_path


def open_source(
    src: str, *, storage: Any = None, image_column: str | None = None, label_column: str | None = None,
    key_column: str | None = None, key: str = "index", label_names: Sequence[str] | None = None,
    follow_symlinks: bool = True, log: Callable[[str], None] | None = None,
) -> Source:
    """Scan SRC (a path or URL): a brace pattern / .tar / directory of .tar (re-shard; .tar.gz and other
    compressed tars are decompressed to a temporary folder first), a table file, or an image folder.

    `label_names` fixes the order of named labels (tables, folders) or names integer ones (tars);
    `follow_symlinks` follows symlinked directories of a local image folder once, or not at all;
    `log` takes notes for the user (decompressing compressed tars; with it, a progress bar too).
    """
    source = _open(src, storage=storage, image_column=image_column, label_column=label_column,
                   key_column=key_column, key=key, label_names=label_names, follow_symlinks=follow_symlinks,
                   log=log)
    if label_names is not None and source.label_names != tuple(label_names):
        source.label_names = tuple(label_names)  # tar shards: .cls integers, named by the given list
    return source


def _open(src: str, *, storage: Any, image_column: str | None, label_column: str | None, key_column: str | None,
          key: str, label_names: Sequence[str] | None, follow_symlinks: bool, log: Callable[[str], None] | None = None) -> Source:
    shown = redact(src, storage.secrets if storage else ())
    if "{" in src or src.endswith(".tar") or is_compressed_tar(src):  # compressed: decompressed first
        paths = expand_braces(src)
        parent = _common_parent(paths)
        store = Store(parent, storage)
        names = [p[len(parent):].lstrip("/") if parent != "." else p for p in paths]  # a/x.tar, b/x.tar stay apart
        missing = [n for n in names if not store.exists(n)]
        if missing:
            raise SourceError(f"{shown}: source shard(s) {missing[:3]} do not exist; check the path or pattern")
        return open_tars(store, names, shown, log=log)
    if "://" not in src or src.startswith("file://"):
        path = src.removeprefix("file://")
        if not os.path.exists(path):
            raise SourceError(f"{path}: the source does not exist; give an image folder, a table or tar shards")
        if os.path.isfile(path):
            if not path.lower().endswith(TABLE_EXTS):
                raise SourceError(f"{path}: not a table ({', '.join(TABLE_EXTS)}) nor a .tar shard")
            return open_table(path, image_column=image_column, label_column=label_column, key_column=key_column,
                              key=key, storage=storage, label_names=label_names)
        if _is_dataset(Store(path, storage)):
            return open_dataset(Store(path, storage), shown)
        tars = sorted(e.name for e in os.scandir(path) if e.is_file() and _is_tar(e.name))
        if tars:
            _refuse_images_beside(path, tars, _first_image(path))
            return open_tars(Store(path, storage), tars, shown, log=log)
        tables = _table_files(Store(path, storage).list())
        if tables:  # a Hugging Face export: data/train-0000N-of-0000M.parquet
            return open_table([os.path.join(path, t) for t in tables], image_column=image_column,
                              label_column=label_column, key_column=key_column, key=key, storage=storage,
                              description=path, label_names=label_names)
        try:
            return open_folder(path, key=key, follow_symlinks=follow_symlinks, label_names=label_names)
        except SourceError as exc:
            _hint_text(path, exc)
            raise
    if src.lower().endswith(TABLE_EXTS):
        return open_table(src, image_column=image_column, label_column=label_column, key_column=key_column,
                          key=key, storage=storage, label_names=label_names)
    store = Store(src, storage)
    if _is_dataset(store):
        return open_dataset(store, shown)
    listed = store.list()
    tars = [n for n in listed if _is_tar(n) and "/" not in n]
    if tars:
        _refuse_images_beside(shown, tars, next((n for n in listed if _is_image(n)), None))
        return open_tars(store, tars, shown, log=log)
    tables = _table_files(listed)
    if tables:
        return open_table([f"{store.raw_url}/{t}" for t in tables], image_column=image_column,
                          label_column=label_column, key_column=key_column, key=key, storage=storage,
                          description=shown, label_names=label_names)
    return open_folder(src, key=key, storage=storage, label_names=label_names)  # ROOT/CLASS/IMAGE in object storage


def _hint_text(path: str, exc: SourceError) -> None:
    """A folder of text files is no image folder: say how to write it (token shards), not only why not."""
    for _top, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        text = next((f for f in files if is_text_path(f)), None)
        if text is not None:
            raise SourceError(f"{exc}; it holds text files (e.g. {text!r}): to tokenize them into token shards, "
                              "pass --tokenizer FILE (make one with `shardify tokenizer train SRC --vocab-size N "
                              "-o tokenizer.json`)") from None


def _is_dataset(store: Store) -> bool:
    """A shardify dataset: its manifest.json names itself so (another tool's manifest.json beside a
    folder's images or tables does not make the folder a dataset)."""
    if not store.exists("manifest.json"):
        return False
    try:
        head = store.read("manifest.json", 0, min(store.size("manifest.json"), 4096))  # the version key comes first
    except ShardifyError:
        return True  # unreadable: open_dataset says why
    return b'"shardify_manifest"' in bytes(head)


def _is_image(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base.startswith(".") and normalize_ext(os.path.splitext(base)[1]) in IMAGE_EXT_SET


def _first_image(root: str) -> str | None:
    """An image file under a local folder (beside its tars, or in its subfolders), found by a walk
    that stops at the first; hidden folders are left out."""
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found = next((f for f in sorted(files) if _is_image(f)), None)
        if found is not None:
            return os.path.relpath(os.path.join(top, found), root)
    return None


def _refuse_images_beside(shown: str, tars: list[str], image: str | None) -> None:
    """A folder holding tar shards and images too: reading only the tars would leave the images
    out without a word, so neither is read."""
    if image is not None:
        raise SourceError(
            f"{shown}: holds tar shards ({len(tars)}, e.g. {tars[0]!r}) and image files too (e.g. {image!r}); a "
            "source is one or the other: move the tars to a folder of their own (or the images), and write "
            "each as its own dataset (one loader reads both: make_loader([a, b]))")


def _is_tar(name: str) -> bool:
    """A tar shard, plain or compressed (.tar.gz, .tgz, .tar.bz2, .tar.xz, .tar.zst)."""
    return name.endswith(".tar") or is_compressed_tar(name)


def _common_parent(paths: list[str]) -> str:
    """The deepest directory (or URL prefix) holding every path; "." for relative paths with none."""
    dirs = [p.rsplit("/", 1)[0] if "/" in p else "" for p in paths]
    common = dirs[0]
    for d in dirs[1:]:
        while common and not (d == common or d.startswith(common + "/")):
            common = common.rsplit("/", 1)[0] if "/" in common else ""
    if "://" in paths[0] and "://" not in common:
        raise SourceError(f"{redact(paths[0])}: the source shards must share a bucket")
    return common or ("/" if paths[0].startswith("/") else ".")


def _table_files(listed: list[str]) -> list[str]:
    """The Parquet files of a prefix that holds tables and no images (sorted: a stable row order)."""
    if any(normalize_ext(os.path.splitext(n)[1]) in IMAGE_EXT_SET for n in listed):
        return []
    return sorted(n for n in listed if n.lower().endswith((".parquet", ".pq"))
                  and not n.rsplit("/", 1)[-1].startswith("."))
