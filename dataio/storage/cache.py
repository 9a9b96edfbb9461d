"""A local disk cache of shard byte ranges with a byte limit, shared by processes and users on a host.

Entries are named by a hash of (dataset URL, path, byte range, checksum), so a rewritten
shard (new checksum) never hits a stale entry. Writers publish by atomic rename from a
private temporary name: two processes filling the same entry both succeed and readers see
a whole file or none, with no lock shared between workers. Eviction is least recently used
(a hit refreshes the entry's mtime; atime is unreliable under relatime/noatime). Each user
gets their own 0700 directory below `directory`. An entry larger than the limit streams
through uncached. The cache is best effort: a full or failing disk only costs hits. Each entry
keeps the checksum of its bytes and is checked on every hit: an entry changed on disk is
refused (dropped and read from the store again, counted in stats.refused), never served. An
entry whose bytes fail a reader's finer checksums (verify_checksums) is dropped the same way
(`discard`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import xxhash

from dataio.errors import StorageError

DIGEST_BYTES = 8  # each entry ends with the xxh3-64 of its bytes
RESCAN_EVERY_INSERTS = 64
LOW_WATER = 0.9  # evict down to this share of the limit, so scans stay rare
STALE_TMP_S = 3600.0


@dataclass(slots=True)
class CacheStats:
    """Counters of this process's use of the cache."""

    hits: int = 0
    misses: int = 0
    streamed: int = 0  # entries larger than the limit, passed through uncached
    evicted: int = 0
    refused: int = 0  # entries whose bytes no longer match their checksum (dropped, read again)


class DiskCache:
    """A local on-disk cache of shard byte ranges or whole shards with a byte limit, safe for several processes and users on one host."""

    def __init__(self, directory: str, *, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.limit_bytes = limit_bytes
        self.root = os.path.join(self.directory, f"user-{os.getuid()}")
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._inserts = 0
        self._estimate_bytes = 0
        self._ready = False

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "limit_bytes": self.limit_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"], limit_bytes=state["limit_bytes"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"DiskCache({self.directory!r}, limit_bytes={self.limit_bytes})"

    def _prepare(self) -> None:
        """Create (or check) this user's private directory; refuse one owned by someone else."""
        if self._ready:
            return
        if not os.path.isdir(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            # Shared parent like /tmp: anyone may add a directory, nobody may remove another's.
            with contextlib.suppress(PermissionError):
                os.chmod(self.directory, 0o1777)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o700)
        st = os.lstat(self.root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise StorageError(
                f"cache directory {self.root} is not a private directory owned by this user "
                "(mode 0700); remove it or choose another cache directory"
            )
        os.makedirs(os.path.join(self.root, "tmp"), mode=0o700, exist_ok=True)
        self._estimate_bytes = self._scan()[1]
        self._ready = True

    def entry_path(self, *, namespace: str, path: str, start: int, end: int, checksum: str) -> str:
        """Where the entry for this byte range lives (two-level fan-out by hash)."""
        key = xxhash.xxh3_128_hexdigest(f"{namespace}\0{path}\0{start}\0{end}\0{checksum}".encode())
        return os.path.join(self.root, key[:2], key)

    def get_or_fetch(
        self, *, namespace: str, path: str, start: int, end: int, checksum: str, fetch: Callable[[], bytes]
    ) -> bytes:
        """Bytes [start, end) of `path`: from disk if cached (and whole), else `fetch()` and store them."""
        size = end - start
        if size > self.limit_bytes:
            self.stats.streamed += 1
            return fetch()
        try:
            self._prepare()
        except OSError:
            return fetch()  # no usable cache directory (read-only, full): still correct, just uncached
        entry = self.entry_path(namespace=namespace, path=path, start=start, end=end, checksum=checksum)
        data = self._load(entry, size)
        if data is not None:
            self.stats.hits += 1
            return data
        self.stats.misses += 1
        data = fetch()
        if len(data) == size:
            self._store(entry, data)
        return data

    def discard(self, *, namespace: str, path: str, start: int, end: int, checksum: str) -> bool:
        """Drop an entry a reader found wrong (counted in stats.refused); False if there was none."""
        try:
            os.unlink(self.entry_path(namespace=namespace, path=path, start=start, end=end, checksum=checksum))
        except OSError:
            return False
        self.stats.refused += 1
        return True

    def _load(self, entry: str, size: int) -> bytes | None:
        try:
            with open(entry, "rb") as f:
                raw = f.read()
        except OSError:  # absent, or evicted by another process just now
            return None
        data, digest = raw[:-DIGEST_BYTES], raw[-DIGEST_BYTES:]
        # A wrong size cannot happen with rename publication, a wrong checksum neither; a damaged
        # disk or a hand-edited entry can: refuse the entry, drop it, read from the store again.
        if len(raw) != size + DIGEST_BYTES or xxhash.xxh3_64_digest(data) != digest:
            self.stats.refused += 1
            with contextlib.suppress(OSError):
                os.unlink(entry)
            return None
        with contextlib.suppress(OSError):
            os.utime(entry)  # refresh for LRU
        return data

    def _store(self, entry: str, data: bytes) -> None:
        tmp = os.path.join(self.root, "tmp", f"{os.path.basename(entry)}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            os.makedirs(os.path.dirname(entry), mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.write(xxhash.xxh3_64_digest(data))  # the entry's checksum, checked on every hit
            os.replace(tmp, entry)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        with self._lock:
            self._estimate_bytes += len(data) + DIGEST_BYTES
            self._inserts += 1
            due = self._estimate_bytes > self.limit_bytes or self._inserts % RESCAN_EVERY_INSERTS == 0
        if due:
            self.evict()

    def _scan(self) -> tuple[list[tuple[float, int, str]], int]:
        """Every entry as (mtime, size, path), and their total size; stale temporaries removed."""
        entries: list[tuple[float, int, str]] = []
        total = 0
        now = time.time()
        for sub in os.scandir(self.root):
            if not sub.is_dir(follow_symlinks=False):
                continue
            is_tmp = sub.name == "tmp"
            with contextlib.suppress(OSError):
                for e in os.scandir(sub.path):
                    with contextlib.suppress(OSError):
                        st = e.stat(follow_symlinks=False)
                        if is_tmp:
                            if now - st.st_mtime > STALE_TMP_S:  # left by a crashed writer
                                os.unlink(e.path)
                            continue
                        entries.append((st.st_mtime, st.st_size, e.path))
                        total += st.st_size
        return entries, total

    def evict(self) -> None:
        """Remove least recently used entries until the cache holds at most LOW_WATER of the limit."""
        with self._lock:
            entries, total = self._scan()
            if total > self.limit_bytes:
                target = int(self.limit_bytes * LOW_WATER)
                for _, size, path in sorted(entries):
                    if total <= target:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        self.stats.evicted += 1
                    total -= size  # gone, whoever removed it
            self._estimate_bytes = total

    def size_bytes(self) -> int:
        """Bytes held by this user's cache now (a directory scan)."""
        self._prepare()
        return self._scan()[1]
