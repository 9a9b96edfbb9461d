"""Conditional writes on a Store: create an object only where none is, replace or remove it only if
unchanged since it was read. Among racing callers exactly one wins, where the store allows it.

Each object read here carries a tag that changes with every write: the ETag on S3, on local disk
the file's inode, modification time and size, in memory:// a hash of the bytes. Local disk:
O_EXCL creates, and each operation holds an flock on the object's directory for its few
system calls, so a reader never sees a half-written file and a replace cannot interleave with
another (one host; NFS gives no such lock). S3: If-None-Match: * and If-Match (SeaweedFS and AWS
hold them under concurrency; tests/sharding/test_lease_s3.py). GCS: ifGenerationMatch (0 to
create), the tag being the object's generation (dataio/storage/gcs.py). Azure: If-None-Match: * and
If-Match on the blob's ETag (dataio/storage/azure.py). Other stores (http://):
best effort, read then write; `exclusive_is_atomic` says which.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dataio import forksafe
from dataio.storage import azure, gcs, s3_ranges
from dataio.storage.cloud_options import AZURE_PROTOCOLS, GCS_PROTOCOLS
from dataio.storage.temps import temporary_beside

if TYPE_CHECKING:
    from collections.abc import Callable

    from dataio.storage.options import StorageOptions

_MEMORY_LOCK = threading.Lock()  # memory:// lives in this process: one lock orders its conditional writes


class ConditionalWrites:
    """The conditional writes of `dataio.storage.store.Store` (a base class of it, kept apart for size)."""

    if TYPE_CHECKING:  # what Store provides
        protocol: str
        is_local: bool
        fs: Any
        options: StorageOptions
        _range_options: StorageOptions | None

        def path(self, rel: str) -> str: ...
        def _retry(self, fn: Callable[[], Any], what: str) -> Any: ...
        def url_of(self, rel: str) -> str: ...
        def write_bytes(self, rel: str, data: bytes, *, durable: bool = True) -> None: ...
        def remove(self, rel: str) -> None: ...

    @property
    def exclusive_is_atomic(self) -> bool:
        """True where exactly one of racing `create_exclusive` / `replace_if` calls can win (local disk,
        memory://, S3 servers that honour If-None-Match and If-Match); False: read, then write."""
        return self.is_local or self.protocol == "memory" or self._s3 is not None or self._gcs or self._azure

    @property
    def _s3(self) -> StorageOptions | None:
        self.fs  # noqa: B018 - decides whether S3 calls go through botocore
        return self._range_options if self.protocol in ("s3", "s3a") else None

    @property
    def _gcs(self) -> bool:
        return self.protocol in GCS_PROTOCOLS

    @property
    def _azure(self) -> StorageOptions | None:
        return self.options if self.protocol in AZURE_PROTOCOLS else None

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create `rel` holding `data` only if no object is there: True if this call created it, False if
        one was there (among racing creators one gets True)."""
        return self.create_tagged(rel, data) is not None

    def create_tagged(self, rel: str, data: bytes) -> str | None:
        """`create_exclusive`, returning the new object's tag (None: an object was there)."""
        path = self.path(rel)
        if self.is_local:
            return _local_create(path, data)
        if self._s3 is not None:
            options = self._s3
            return self._retry(lambda: s3_ranges.put_if(options, path, data, absent=True),
                               f"creating {self.url_of(rel)}")
        if self._gcs:
            return self._retry(lambda: gcs.put_if(self.fs, path, data, "0"), f"creating {self.url_of(rel)}")
        if (az := self._azure) is not None:
            return self._retry(lambda: azure.put_if(az, path, data), f"creating {self.url_of(rel)}")
        with _MEMORY_LOCK:  # memory:// (atomic); other stores: best effort, see the module's doc
            if self.read_tagged(rel) is not None:
                return None
            self.write_bytes(rel, data)
            return _digest(data)

    def read_tagged(self, rel: str) -> tuple[bytes, str] | None:
        """(bytes, tag) of `rel`, None if there is no such object."""
        path = self.path(rel)
        if self.is_local:
            return _local_read(path)
        if self._s3 is not None:
            options = self._s3
            return self._retry(lambda: s3_ranges.get_tagged(options, path), f"reading {self.url_of(rel)}")
        if self._gcs:
            return self._retry(lambda: gcs.get_tagged(self.fs, path), f"reading {self.url_of(rel)}")
        if (az := self._azure) is not None:
            return self._retry(lambda: azure.get_tagged(az, path), f"reading {self.url_of(rel)}")
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return data, _digest(data)

    def replace_if(self, rel: str, data: bytes, tag: str) -> str | None:
        """Write `data` at `rel` only if the object there still has `tag`: the new tag, or None if it
        changed or is gone (a retry whose first try was applied also gets None: read to tell)."""
        path = self.path(rel)
        if self.is_local:
            return _local_replace(path, data, tag)
        if self._s3 is not None:
            options = self._s3
            return self._retry(lambda: s3_ranges.put_if(options, path, data, etag=tag),
                               f"replacing {self.url_of(rel)}")
        if self._gcs:
            return self._retry(lambda: gcs.put_if(self.fs, path, data, tag), f"replacing {self.url_of(rel)}")
        if (az := self._azure) is not None:
            return self._retry(lambda: azure.put_if(az, path, data, etag=tag), f"replacing {self.url_of(rel)}")
        with _MEMORY_LOCK:
            now = self.read_tagged(rel)
            if now is None or now[1] != tag:
                return None
            self.write_bytes(rel, data)
            return _digest(data)

    def remove_if(self, rel: str, tag: str) -> bool:
        """Remove `rel` only if it still has `tag`: True if removed (or gone), False if it changed."""
        path = self.path(rel)
        if self.is_local:
            with _locked_dir(os.path.dirname(path)):
                now = _local_read(path, locked=True)
                if now is not None and now[1] == tag:
                    os.unlink(path)
                return now is None or now[1] == tag
        if self._s3 is not None:
            options = self._s3
            return bool(self._retry(lambda: s3_ranges.delete_if(options, path, tag), f"removing {self.url_of(rel)}"))
        if self._gcs:
            return bool(self._retry(lambda: gcs.delete_if(self.fs, path, tag), f"removing {self.url_of(rel)}"))
        if (az := self._azure) is not None:
            return bool(self._retry(lambda: azure.delete_if(az, path, tag), f"removing {self.url_of(rel)}"))
        with _MEMORY_LOCK:
            now = self.read_tagged(rel)
            if now is not None and now[1] == tag:
                self.remove(rel)
            return now is None or now[1] == tag


def _digest(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _tag(st: os.stat_result) -> str:
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


@contextlib.contextmanager
def _locked_dir(directory: str) -> Iterator[None]:
    """An exclusive flock on `directory` (created if missing) for the duration of one operation. No fork
    happens meanwhile (forksafe.busy): a child would inherit the descriptor, and the lock with it."""
    os.makedirs(directory or ".", exist_ok=True)
    with forksafe.busy():
        fd = os.open(directory or ".", os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def _local_create(path: str, data: bytes) -> str | None:
    with _locked_dir(os.path.dirname(path)):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        try:
            os.write(fd, data)
            os.fsync(fd)
            return _tag(os.fstat(fd))
        finally:
            os.close(fd)


def _local_read(path: str, *, locked: bool = False) -> tuple[bytes, str] | None:
    with contextlib.nullcontext() if locked else _locked_dir(os.path.dirname(path)):
        try:
            with open(path, "rb") as f:
                return f.read(), _tag(os.fstat(f.fileno()))
        except FileNotFoundError:
            return None


def _local_replace(path: str, data: bytes, tag: str) -> str | None:
    with _locked_dir(os.path.dirname(path)):
        now = _local_read(path, locked=True)
        if now is None or now[1] != tag:
            return None
        with temporary_beside(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                new = _tag(os.fstat(f.fileno()))
            os.replace(tmp, path)
        return new
