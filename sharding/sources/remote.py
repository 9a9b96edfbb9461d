"""Source files by path or URL (s3://, gs://, ...): read and sized in parallel threads, each request
with the loader's retry policy (dataio.storage.store.Store: backoff on transient errors, short reads
detected, credentials redacted from every message)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dataio.storage.store import Store, with_retry

T = TypeVar("T")
R = TypeVar("R")
THREADS = 16  # requests in flight per writer process: object-storage latency, not bandwidth, bounds a GET
CHUNK = 64  # items loaded ahead at most: a shard's images are never all in memory at once


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def split_url(url: str) -> tuple[str, str]:
    """("s3://bucket", "key/of/object") of a URL."""
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", key


class RemoteFiles:
    """Reads whole files by local path or URL; one Store (one client, one retry policy) per bucket."""

    def __init__(self, storage: Any = None) -> None:
        self.storage = storage
        self._stores: dict[str, Store] = {}

    def _store(self, url: str) -> tuple[Store, str]:
        root, key = split_url(url)
        store = self._stores.get(root)
        if store is None:
            store = self._stores[root] = Store(root, self.storage)
        return store, key

    def read(self, path: str) -> bytes:
        """The whole file; StorageError (remote, after retries) or OSError (local) says which."""
        if not is_url(path):
            with open(path.removeprefix("file://"), "rb") as f:
                return f.read()
        store, key = self._store(path)
        return store.read(key)

    def size(self, path: str) -> int:
        """Bytes of the file, 0 when it cannot be found (the load reports it then, per --on-error)."""
        try:
            if not is_url(path):
                return os.stat(path.removeprefix("file://")).st_size
            store, key = self._store(path)
            return store.size(key)
        except Exception:  # noqa: BLE001 - a missing file is reported when the sample is loaded
            return 0

    def sizes(self, paths: Sequence[str]) -> list[int]:
        return list(self.map(lambda p: self.size(p) if p else 0, list(paths)))

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """fn over items in order, on threads, at most CHUNK items ahead of the consumer."""
        if len(items) <= 1:
            yield from (fn(x) for x in items)
            return
        with ThreadPoolExecutor(min(THREADS, len(items)), thread_name_prefix="shardify-source") as pool:
            for start in range(0, len(items), CHUNK):
                yield from pool.map(fn, items[start : start + CHUNK])


def list_sizes(store: Store, sub: str, *, recursive: bool = True, dirs: bool = False) -> list[tuple[str, int]]:
    """(path relative to store/sub, size) below a prefix, retried; with dirs=True (and not recursive)
    the immediate sub-folders too (size 0). Empty when the prefix does not exist."""
    fs = store.fs
    root = store.path(sub) if sub else store.root
    root = root.rstrip("/")

    def once() -> list[tuple[str, int]]:
        try:
            if recursive:
                found = fs.find(root, detail=True)
            else:
                found = {e["name"]: e for e in fs.ls(root, detail=True)}
        except FileNotFoundError:
            return []
        cut = len(root) + 1
        return [(p.rstrip("/")[cut:], int(info.get("size") or 0)) for p, info in found.items()
                if p.startswith(root + "/") and (info.get("type") != "directory" or dirs)]

    return with_retry(once, what=f"listing {store.url_of(sub) if sub else store.url}", policy=store.retry,
                      secrets=store.secrets)
