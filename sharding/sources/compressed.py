"""Compressed tar shards (.tar.gz, .tgz, .tar.bz2, .tar.xz, .tar.zst) as a source: decompressed first.

Re-sharding reads each sample at its member offsets, which a compressed stream cannot seek to, so
each compressed shard is streamed once through its decompressor into a plain .tar in a temporary
folder (under TMPDIR, on this machine: it needs about the shards' uncompressed size) and read from
there. The folder is removed when the source is no longer used (garbage collected, or this
process exits); only the process that made it removes it, never a forked writer worker. Messages,
sample origins and provenance keep naming the compressed files.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import lzma
import os
import shutil
import sys
import tempfile
import weakref
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dataio.storage.store import Store
from sharding.sources.base import SourceError

COMPRESSED_TAR_EXTS = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
CHUNK = 8 << 20


def is_compressed_tar(name: str) -> bool:
    return name.lower().endswith(COMPRESSED_TAR_EXTS)


def plain_name(name: str) -> str:
    """The shard's name as a plain tar: `a/x.tar.gz` -> `a/x.tar`, `x.tgz` -> `x.tar`."""
    low = name.lower()
    for ext in COMPRESSED_TAR_EXTS:
        if low.endswith(ext):
            return name[: len(name) - len(ext)] + ".tar"
    return name


class Decompressed:
    """Plain copies of compressed tar shards in a temporary folder: `store` holds `names[i]` for
    the i-th given shard. `keep_alive(owner)` removes the folder once `owner` is gone."""

    def __init__(self, store: Store, names: list[str], *, log: Callable[[str], None] | None = None) -> None:
        mixed = [n for n in names if not is_compressed_tar(n)]
        if mixed:
            raise SourceError(
                f"{store.url_of(mixed[0])}: the source mixes plain and compressed tar shards; give them as "
                "two sources, or decompress the compressed ones first (e.g. `gunzip -k FILE.tar.gz`)")
        self.root = tempfile.mkdtemp(prefix="shardify-untar-")
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _remove, self.root, self._pid)
        width = len(str(max(0, len(names) - 1)))
        self.names = [f"{i:0{width}d}-{os.path.basename(plain_name(n))}" for i, n in enumerate(names)]
        try:
            self._run(store, names, log)
        except BaseException:
            self.remove()
            raise
        self.store = Store(self.root)

    def _run(self, store: Store, names: list[str], log: Callable[[str], None] | None) -> None:
        """`log`: the caller's channel for a note (the CLI's stderr, unless --quiet); with one, a
        progress bar of compressed bytes read is drawn on a terminal too. Without: silent."""
        bar = None
        if log is not None:
            log(f"decompressing {len(names)} compressed tar shard(s) into {self.root} (removed when done; "
                "set TMPDIR to put it on a larger disk)")
            if sys.stderr.isatty():  # as `shardify write` draws its own
                from sharding.progress import bar_class

                sizes = [_size_or_none(store, n) for n in names]  # a HEAD each: only for the bar
                bar = bar_class()(total=sum(s for s in sizes if s) or None, desc="decompress", unit="B",
                                   unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False)
        advance = bar.update if bar is not None else (lambda n: None)
        try:  # a shard per core at once (zlib, bz2 and lzma release the GIL while they decompress)
            with ThreadPoolExecutor(max(1, min(len(names), os.cpu_count() or 1))) as pool:
                jobs = [pool.submit(_decompress, store, name, os.path.join(self.root, local), advance)
                        for name, local in zip(names, self.names)]
                for job in jobs:
                    if job.exception() is not None:
                        for other in jobs:
                            other.cancel()
                        raise job.exception()  # type: ignore[misc]
        finally:
            if bar is not None:
                bar.close()

    def keep_alive(self, owner: Any) -> None:
        """Remove the folder when `owner` (the source reading from it) is garbage collected."""
        self._finalizer.detach()
        self._finalizer = weakref.finalize(owner, _remove, self.root, self._pid)

    def remove(self) -> None:
        self._finalizer()


def _remove(root: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked worker's copy of the source must not remove the parent's files
        shutil.rmtree(root, ignore_errors=True)


def _size_or_none(store: Store, name: str) -> int | None:
    try:
        return store.size(name)
    except Exception:  # noqa: BLE001 - only for the progress bar; the read below names any problem
        return None


def _decompress(store: Store, name: str, dest: str, advance: Any) -> None:
    url = store.url_of(name)
    try:
        with store.fs.open(store.path(name), "rb") as raw:
            counted = _Counted(raw, advance)
            with _reader(name, url, counted) as stream, open(dest, "wb") as out:
                shutil.copyfileobj(stream, out, CHUNK)
    except SourceError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise SourceError(f"{url}: no space left in {os.path.dirname(dest)} to decompress it (it needs the "
                              "shards' uncompressed size); set TMPDIR to a larger disk, or decompress the shards "
                              "yourself and pass the .tar files") from None
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise SourceError(f"{url}: cannot read it ({exc.strerror or exc})") from None
        raise SourceError(f"{url}: cannot decompress it ({type(exc).__name__}: {exc}); the file is damaged or "
                          "cut short: download it again") from None
    except (EOFError, lzma.LZMAError, zlib.error, ValueError) as exc:
        raise SourceError(f"{url}: cannot decompress it ({type(exc).__name__}: {exc}); the file is damaged or "
                          "cut short: download it again") from None
    except Exception as exc:  # zstandard.ZstdError and the like
        if type(exc).__module__.startswith("zstandard"):
            raise SourceError(f"{url}: cannot decompress it ({exc}); the file is damaged or cut short: download "
                              "it again") from None
        raise


def _reader(name: str, url: str, raw: Any) -> Any:
    low = name.lower()
    if low.endswith((".tar.gz", ".tgz")):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if low.endswith(".tar.bz2"):
        return bz2.BZ2File(raw, "rb")
    if low.endswith(".tar.xz"):
        return lzma.LZMAFile(raw, "rb")
    try:
        import zstandard
    except ImportError:
        raise SourceError(f"{url}: reading .tar.zst shards needs the zstandard package (`pip install zstandard`); "
                          "or decompress them first (`zstd -d FILE.tar.zst`) and pass the .tar files") from None
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


class _Counted:
    """A binary file that reports how many bytes were read from it (the progress bar)."""

    def __init__(self, raw: Any, advance: Any) -> None:
        self._raw, self._advance = raw, advance

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._advance(len(data))
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
