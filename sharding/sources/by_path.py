"""The chooser: which source a `shardify write` SRC argument is (tars, a table, a dataset, an image folder)."""

from __future__ import annotations

import os
from typing import Any

from dataio.storage.store import Store, redact
from sharding.sources.base import (
    IMAGE_EXT_SET,
    TABLE_EXTS,
    Source,
    SourceError,
    normalize_ext,
)
from sharding.sources.folder import open_folder
from sharding.sources.table import open_table
from sharding.sources.tar import expand_braces, open_dataset, open_tars


def open_source(
    src: str, *, storage: Any = None, image_column: str | None = None, label_column: str | None = None,
    key_column: str | None = None, key: str = "index",
) -> Source:
    """Scan SRC (a path or URL): a brace pattern / .tar / directory of .tar (re-shard), a table file, or an image folder."""
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
            return open_table(path, image_column=image_column, label_column=label_column, key_column=key_column,
                              key=key, storage=storage)
        if os.path.isfile(os.path.join(path, "manifest.json")):
            return open_dataset(Store(path, storage), shown)
        tars = sorted(e.name for e in os.scandir(path) if e.is_file() and e.name.endswith(".tar"))
        if tars:
            return open_tars(Store(path, storage), tars, shown)
        tables = _table_files(Store(path, storage).list())
        if tables:  # a Hugging Face export: data/train-0000N-of-0000M.parquet
            return open_table([os.path.join(path, t) for t in tables], image_column=image_column,
                              label_column=label_column, key_column=key_column, key=key, storage=storage,
                              description=path)
        return open_folder(path, key=key)
    if src.lower().endswith(TABLE_EXTS):
        return open_table(src, image_column=image_column, label_column=label_column, key_column=key_column,
                          key=key, storage=storage)
    store = Store(src, storage)
    if store.exists("manifest.json"):
        return open_dataset(store, shown)
    listed = store.list()
    tars = [n for n in listed if n.endswith(".tar") and "/" not in n]
    if tars:
        return open_tars(store, tars, shown)
    tables = _table_files(listed)
    if tables:
        return open_table([f"{store.raw_url}/{t}" for t in tables], image_column=image_column,
                          label_column=label_column, key_column=key_column, key=key, storage=storage,
                          description=shown)
    return open_folder(src, key=key, storage=storage)  # ROOT/CLASS/IMAGE in object storage


def _table_files(listed: list[str]) -> list[str]:
    """The Parquet files of a prefix that holds tables and no images (sorted: a stable row order)."""
    if any(normalize_ext(os.path.splitext(n)[1]) in IMAGE_EXT_SET for n in listed):
        return []
    return sorted(n for n in listed if n.lower().endswith((".parquet", ".pq"))
                  and not n.rsplit("/", 1)[-1].startswith("."))
