"""Storage through fsspec: a dataset prefix on any URL, atomic publish, ranged reads with retry.

Credentials come from flags, a config file or the standard AWS variables (in that order) and
never appear in a message: every URL or error text that leaves this module passes `redact`.
A `Store` is picklable and opens its filesystem lazily, so each worker process (fork or
spawn) makes its own client; s3fs clients must not cross a fork.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, BinaryIO, TypeVar

from dataio.errors import ShardFormatError, StorageError
from dataio.storage.exclusive import ConditionalWrites  # create_exclusive, replace_if, remove_if
from dataio.storage.forked import keep_in_forked_children
from dataio.storage.hedge import Hedger, shared_hedger
from dataio.storage.options import StorageOptions
from dataio.storage import azure, cloud_options, gcs, gcs_resumable, s3_into, s3_list, s3_ranges
from dataio.storage.paths import check_relative
from dataio.storage.redact import redact, url_secrets
from dataio.storage.temps import temporary_beside
from dataio.storage.retry import (  # noqa: F401 - RetryPolicy, with_retry & co. are also this module's API
    FIRST_REQUEST_DEADLINE_S,
    FIRST_REQUEST_UNREACHABLE_ATTEMPTS,
    RetryPolicy,
    ShortReadError,
    TruncatedFileError,
    UnconfirmedWriteError,
    is_transient,
    safe_cause,
    with_retry,
)
from dataio.storage.upload import confirm, size_and_md5, upload_parts

T = TypeVar("T")

# Objects up to this size stay in memory while written; above it they spool to a temporary file.
_SPOOL_BYTES = 64 << 20
# Below this an upload is one PUT (its ETag is the MD5 of the bytes); above, a multipart upload
# of _PART_BYTES parts (its ETag is the MD5 of the parts' MD5s, then "-" and the number of parts).
_SINGLE_PUT_BYTES = 100 << 20
_PART_BYTES = 64 << 20
_MAX_PARTS = 10_000  # S3's limit: larger objects get larger parts


# Held while a filesystem is opened: fsspec (not imported for local reads) is then imported by whichever
# thread opens one first, and two threads importing it at once see a partially initialised module.
_OPENING = threading.RLock()


def _fresh_opening_lock() -> None:
    global _OPENING
    _OPENING = threading.RLock()  # a child forked while another thread held it must not wait forever


os.register_at_fork(after_in_child=_fresh_opening_lock)


class Store(ConditionalWrites):
    """A prefix (directory) on any fsspec filesystem; every path given to it is relative to the prefix."""

    def __init__(
        self, url: str, options: StorageOptions | None = None, retry: RetryPolicy | None = None
    ) -> None:
        self.raw_url = str(url).rstrip("/") or "/"
        self.options = options or StorageOptions()
        self.retry = retry or self.options.retry
        # Every credential this store knows, from its options or its URL, is redacted in messages.
        self.secrets = self.options.secrets + url_secrets(self.raw_url)
        self._fs: Any = None
        self._fs_pid = 0
        self._root = ""
        self._range_options: StorageOptions | None = None  # S3: reads through s3_into (presigned GETs)
        self._resolved_pid = 0  # the process the root and _range_options were worked out in (_resolve)
        self._hedger: Hedger | None = None
        self._hedger_pid = 0
        # Where GCS resumable upload sessions are recorded (a writer's journal), or None: unrecorded.
        self.session_log: gcs_resumable.SessionLog | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"raw_url": self.raw_url, "options": self.options, "retry": self.retry, "session_log": self.session_log}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["raw_url"], state["options"], state["retry"])  # type: ignore[misc]
        self.session_log = state.get("session_log")

    def recording_sessions(self, log: gcs_resumable.SessionLog) -> Store:
        """This store, recording every GCS resumable upload session it opens in `log` before the first byte."""
        out = Store(self.raw_url, self.options, self.retry)
        out.session_log = log
        return out

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def url(self) -> str:
        """The prefix URL with credentials removed: the only form that goes into messages."""
        return redact(self.raw_url, self.secrets)

    @property
    def protocol(self) -> str:
        return self.raw_url.split("://", 1)[0] if "://" in self.raw_url else "file"

    @property
    def is_local(self) -> bool:
        return self.protocol in ("file", "local")

    @property
    def fs(self) -> Any:
        # Reopen after a fork: an s3fs client inherited from the parent is not fork-safe.
        if self._fs is None or self._fs_pid != os.getpid():
            with _OPENING:  # fsspec may be imported here first, in any thread: one import at a time
                return self._open_fs()
        return self._fs

    def _open_fs(self) -> Any:
        if self._fs is None or self._fs_pid != os.getpid():
            from fsspec.core import url_to_fs

            self._fs_pid = os.getpid()

            url, options = s3_ranges.keyed(self.raw_url, self.options) if self.protocol in ("s3", "s3a") else (
                self.raw_url, self.options)
            try:
                if self.protocol in cloud_options.GCS_PROTOCOLS:  # the JSON API only: see gcs.py
                    self._fs, self._root = gcs.open_fs(url, options.fsspec_kwargs(self.protocol))
                else:
                    self._fs, self._root = url_to_fs(url, **options.fsspec_kwargs(self.protocol))
            except (ImportError, ValueError) as exc:
                raise StorageError(
                    f"{self.url}: cannot open this URL ({redact(str(exc), self.secrets)}); "
                    "for s3:// install shardify[s3], for gs:// shardify[gcs], for az:// and abfs:// "
                    "shardify[azure], for http(s):// aiohttp"
                ) from safe_cause(exc, self.secrets)
            self._root = _local_root(self.raw_url) if self.is_local else self._root.rstrip("/")
            keep_in_forked_children(self._fs)
            if self.protocol in ("s3", "s3a") and s3_ranges.available():
                self._range_options = options
            cloud_options.one_try(self._fs, self.protocol)  # gcsfs, Azure's SDK: our retries only
            self._resolved_pid = os.getpid()
            if hasattr(self._fs, "retries") and self.protocol in ("s3", "s3a"):
                # s3fs retries 5 times on its own (under botocore's tries, under ours): one layer of
                # backoff, ours, spends the budget; a layer below would multiply it or cap it.
                self._fs.retries = 1
        return self._fs

    def _resolve(self) -> None:
        """The root and how reads go: S3 read through botocore builds no s3fs filesystem (as slow as a request)."""
        if self._resolved_pid != os.getpid() and self.protocol in ("s3", "s3a") and s3_ranges.available():
            url, self._range_options = s3_ranges.keyed(self.raw_url, self.options)
            self._root, self._resolved_pid = url.split("://", 1)[1].rstrip("/"), os.getpid()  # as url_to_fs's
        elif self._resolved_pid != os.getpid() and self.is_local:  # no fsspec (its import alone takes ~35 ms)
            self._root, self._resolved_pid = _local_root(self.raw_url), os.getpid()
        elif self._resolved_pid != os.getpid():
            self.fs  # noqa: B018 - resolves the root

    @property
    def root(self) -> str:
        """The filesystem path of the prefix itself (a local folder, or bucket/key on a store)."""
        self._resolve()
        return self._root

    def path(self, rel: str) -> str:
        """The filesystem path of `rel` below the prefix (checked to stay inside it)."""
        root = self.root
        return f"{root}/{check_relative(rel)}" if root else check_relative(rel)

    def url_of(self, rel: str) -> str:
        """Redacted URL of `rel`, for messages."""
        return f"{self.url}/{rel}"

    def first_request(self, deadline_s: float = FIRST_REQUEST_DEADLINE_S) -> Store:
        """This store with its retries bounded by `deadline_s` in all, and a few tries where no server
        answers at all: for the first request, which tells a wrong or stuck endpoint from a slow read."""
        budget = deadline_s if self.retry.deadline_s is None else min(deadline_s, self.retry.deadline_s)
        policy = replace(self.retry, deadline_s=budget, max_unreachable_attempts=FIRST_REQUEST_UNREACHABLE_ATTEMPTS)
        return Store(self.raw_url, self.options, policy)

    def child(self, rel: str) -> Store:
        """A Store for a sub-prefix."""
        return Store(f"{self.raw_url}/{check_relative(rel)}", self.options, self.retry)

    def _retry(self, fn: Callable[[], T], what: str, ends_at: float | None = None) -> T:
        """fn() under this store's retry policy; `ends_at` (monotonic): a budget shared with other calls."""
        return with_retry(fn, what=what, policy=self.retry, secrets=self.secrets, ends_at=ends_at)

    def read(self, rel: str, start: int | None = None, end: int | None = None, *, expect_size: int | None = None,
             object_size: int | None = None) -> bytes:
        """Bytes [start, end) of `rel` (whole file when both are None); short reads are retried, then fail.
        object_size: the whole object's size as the manifest gives it, checked against the size a ranged
        read's answer states (Content-Range) where the store gives one (`sizes_on_read`): ShardFormatError."""
        if start is not None and end is not None and end - start <= 0:
            return b""
        path = self.path(rel)
        want = expect_size if start is None else (end - start if end is not None else None)

        # s3fs sends a HEAD (and on a timeout, a listing) before a whole-object GET unless told to
        # read in one piece: one request per try keeps a stuck endpoint at one timeout per try.
        whole = {"max_concurrency": 1} if self.protocol in ("s3", "s3a") else {}

        def once() -> tuple[bytes, int | None]:
            total = None
            if self._range_options is not None and (start is None) == (end is None):  # threads in parallel
                data, total = s3_into.get_bytes(self._range_options, path, start, end)
            elif self.is_local:
                data = _read_local(path, start, end)
            elif start is None and end is None:
                data = self.fs.cat_file(path, **whole)
            else:
                data = self.fs.cat_file(path, start=start, end=end)
            if want is not None and len(data) != want:
                if self.is_local:  # a file on disk does not grow by asking again: fail now, not after the budget
                    raise TruncatedFileError(f"got {len(data)} bytes, expected {want}: the file is shorter than "
                                             "the dataset says (cut short or changed after it was written)")
                raise ShortReadError(f"got {len(data)} bytes, expected {want}")
            return data, total

        what, ends_at = f"reading {self.url_of(rel)}{'' if start is None else f' bytes {start}-{end}'}", None
        hedger = self.hedger
        if hedger is None:
            data, total = self._retry(once, what)
        else:  # whole objects (indexes, footers) are hedged in the size class of what they should be
            ends_at = self.retry.ends_at(time.monotonic())  # one budget for the read and its hedges
            data, total = hedger.call(lambda: self._retry(once, what, ends_at), want or 0)
        self._check_size(rel, total, object_size)
        return data

    def read_into(self, rel: str, start: int, end: int, dest: memoryview, *, object_size: int | None = None) -> None:
        """Bytes [start, end) of `rel` into dest[: end - start], as read() checks them. S3 through botocore: in
        parallel parts, each body received in place (s3_into); other stores: read() and one copy."""
        if end <= start:
            return
        self._resolve()
        if self._range_options is None:
            dest[: end - start] = memoryview(self.read(rel, start, end, object_size=object_size)).cast("B")
            return
        totals = s3_into.read_into(self._range_options, self.path(rel), start, end, dest,
                                   what=f"reading {self.url_of(rel)}", retry=self.retry, secrets=self.secrets,
                                   hedger=self.hedger)
        for total in totals:
            self._check_size(rel, total, object_size)

    def _check_size(self, rel: str, total: int | None, object_size: int | None) -> None:
        """ShardFormatError where a read's answer states a whole size other than the manifest's."""
        if object_size is not None and total is not None and total != object_size:
            raise ShardFormatError(
                f"{self.url_of(rel)}: shard is {total} bytes but the manifest says {object_size}; the shard or the "
                "manifest was replaced or damaged: rewrite the dataset with `shardify write`"
            )

    @property
    def sizes_on_read(self) -> bool:
        """True when every ranged read states the object's whole size (S3 through botocore), so
        read(..., object_size=) checks a shard's size at no cost; else the size takes a HEAD (`size`)."""
        self._resolve()  # decides how ranged reads go
        return self._range_options is not None

    @property
    def hedger(self) -> Hedger | None:
        """This process's Hedger for reads, or None (local and in-memory stores, or no policy)."""
        if self.options.hedge is None or self.protocol in ("file", "local", "memory"):
            return None
        if self._hedger is None or self._hedger_pid != os.getpid():
            # One Hedger (latency history, budget) per endpoint and process: every Store of the same
            # store learns from the others' reads (the prefix does not change how fast it answers).
            bucket = self.raw_url.split("://", 1)[1].split("/", 1)[0]
            key = f"{self.protocol}|{self.options.endpoint_url or ''}|{bucket}"
            self._hedger, self._hedger_pid = shared_hedger(key, self.options.hedge), os.getpid()
        return self._hedger

    def size(self, rel: str) -> int:
        """The object's size in bytes (a HEAD on object stores: hedged like a small read)."""
        path, ends_at = self.path(rel), self.retry.ends_at(time.monotonic())  # one budget for its hedges too

        def once() -> int:
            return int(self._retry(lambda: self._stat(path)["size"], f"size of {self.url_of(rel)}", ends_at))

        hedger = self.hedger
        return once() if hedger is None else hedger.call(once, 0)

    def _stat(self, path: str) -> dict[str, Any]:
        """fsspec's info of `path` (local files: os.stat's size and mtime, without fsspec); on GCS one GET of
        the object (gcsfs's info also lists it as a folder)."""
        if self.is_local:
            st = os.stat(path)
            return {"size": st.st_size, "mtime": st.st_mtime}
        return gcs.stat(self.fs, path) if self.protocol in cloud_options.GCS_PROTOCOLS else self.fs.info(path)

    def exists(self, rel: str) -> bool:
        path = self.path(rel)
        if self.is_local:
            return os.path.exists(path)
        return bool(self._retry(lambda: self.fs.exists(path), f"checking {self.url_of(rel)}"))

    def prefix_exists(self) -> bool:
        """True if the prefix itself exists (a directory, or any object below it on a store)."""
        root = self.root
        return bool(self._retry(lambda: self.fs.exists(root), f"checking {self.url}"))

    def list(self) -> list[str]:
        """Relative names of every file below the prefix (recursive); empty if the prefix is absent."""
        root = self.root

        def once() -> list[str]:
            try:  # S3: ListObjectsV2 through urllib3 (s3_list): no s3fs to import and build first
                found = s3_list.list_keys(self._range_options, root) if self._range_options else self.fs.find(root)
            except FileNotFoundError:
                return []
            cut = len(root) + 1
            return sorted(p[cut:] for p in found if p.startswith(root + "/"))

        return self._retry(once, f"listing {self.url}")

    def list_info(self) -> list[tuple[str, int, float]]:
        """(relative name, size, modification time in epoch seconds) of every file below the prefix."""
        root = self.root

        def once() -> list[tuple[str, int, float]]:
            try:
                found = self.fs.find(root, detail=True)
            except FileNotFoundError:
                return []
            cut = len(root) + 1
            return sorted((p[cut:], int(info.get("size") or 0), _mtime_s(info))
                          for p, info in found.items() if p.startswith(root + "/"))

        return self._retry(once, f"listing {self.url}")

    def abort_uploads(self, older_than_s: float) -> list[str]:
        """Abort the S3 multipart uploads below the prefix started more than `older_than_s` ago (Azure: discard
        blobs' uncommitted blocks; GCS: none, see the object-storage guide); their keys."""
        if self.protocol in cloud_options.AZURE_PROTOCOLS:
            root = self.fs and self._root
            return self._retry(lambda: azure.discard_uncommitted(self.options, root, older_than_s),
                               f"discarding uncommitted blocks below {self.url}")
        if self.protocol not in ("s3", "s3a"):
            return []
        bucket, _, key_prefix = self.root.partition("/")
        now = time.time()
        aborted = []
        resp = self._retry(lambda: self.fs.call_s3("list_multipart_uploads", Bucket=bucket,
                                                   Prefix=key_prefix.rstrip("/") + "/"),
                           f"listing multipart uploads of {self.url}")
        for up in resp.get("Uploads") or []:
            started = up.get("Initiated")
            if started is not None and now - started.timestamp() < older_than_s:
                continue
            self._retry(lambda up=up: self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=up["Key"],
                                                      UploadId=up["UploadId"]),
                        f"aborting an upload to {self.url}")
            aborted.append(up["Key"][len(key_prefix.rstrip("/")) + 1:])
        return aborted

    def remove(self, rel: str) -> None:
        path = self.path(rel)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)

    def write_bytes(self, rel: str, data: bytes, *, durable: bool = True) -> None:
        """Publish `data` at `rel` atomically: readers see the old object or the whole new one."""
        with self.open_atomic(rel, durable=durable) as f:
            f.write(data)

    def make_durable(self, rels: Sequence[str]) -> None:
        """Local disk: fsync the files `rels` (written with durable=False) and their directories,
        so they and their renames survive a power cut; object stores confirm each write already."""
        if not self.is_local:
            return
        directories: dict[str, None] = {}
        for rel in rels:
            path = self.path(rel)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            directories[os.path.dirname(path) or "."] = None
        for directory in directories:
            _fsync_directory(directory)

    @contextlib.contextmanager
    def open_atomic(self, rel: str, *, durable: bool = True) -> Iterator[BinaryIO]:
        """A writer whose bytes appear at `rel` only if the block exits cleanly and the store confirms them.

        Local disk: a hidden temporary name in the same directory, fsync, rename, fsync of the
        directory. Object stores: the bytes are collected in a spooled temporary file (memory up
        to 64 MiB, then disk); each upload attempt sends all of them afresh (a single PUT, or a
        multipart upload that appears only when complete, each part retried until its ETag is the
        MD5 of its bytes), then a HEAD must show the expected size and, where the store gives an
        ETag of the usual form, the one computed from the bytes sent (MD5 for one PUT, MD5 of the
        parts' MD5s and "-N" for N parts); the tries, the parts' included, share one retry budget.
        Anything else raises StorageError naming the URL.
        durable=False (local disk): no fsync; the caller makes a batch of such files durable at once
        with `make_durable` before anything refers to them (the writer: before its journal does).
        """
        if self.is_local:
            with self._open_local_atomic(rel, durable=durable) as f:
                yield f
            return
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
            yield spool  # type: ignore[misc]
            self._upload_confirmed(rel, spool)

    @contextlib.contextmanager
    def _open_local_atomic(self, rel: str, *, durable: bool = True) -> Iterator[BinaryIO]:
        path = self.path(rel)
        directory = os.path.dirname(path)
        os.makedirs(directory or ".", exist_ok=True)
        with temporary_beside(path) as tmp:
            with open(tmp, "w+b") as f:  # readable too: a writer may read back what it wrote
                yield f
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
            if durable:
                _fsync_directory(directory or ".")  # the rename itself survives a power cut

    def _upload_confirmed(self, rel: str, spool: Any) -> None:
        """Upload the whole spool (again on each try) and confirm it with a HEAD; StorageError if never."""
        path = self.path(rel)
        spool.flush()
        size, md5 = size_and_md5(spool)
        what, ends_at = f"uploading {self.url_of(rel)} ({size} bytes)", self.retry.ends_at(time.monotonic())
        part_bytes = max(_PART_BYTES, -(-size // _MAX_PARTS))

        def once() -> None:  # all the bytes again, then the HEAD; the parts share the upload's budget
            spool.seek(0)
            if self.protocol in cloud_options.GCS_PROTOCOLS and size >= self.options.gcs_resumable_bytes:
                self._upload_resumable(rel, spool, size, lambda fn, step: self._retry(fn, f"{what}, {step}", ends_at))
                etag = md5
            elif size < _SINGLE_PUT_BYTES or self.protocol not in ("s3", "s3a"):
                self.fs.pipe_file(path, spool.read())
                etag = md5
            else:
                etag = upload_parts(self.fs, path, spool, part_bytes,
                                    lambda put, part: self._retry(put, f"{what}, {part}", ends_at))
            confirm(self.fs, path, self.url_of(rel), size, etag, self._stat)

        self._retry(once, what, ends_at)

    def _upload_resumable(self, rel: str, spool: Any, size: int, retry: gcs_resumable.Retry) -> None:
        """GCS: one resumable upload of our own, its session recorded in `session_log` (if any) first."""
        log, plain = self.session_log, Store(self.raw_url, self.options, self.retry)  # records are not recorded
        gcs_resumable.upload(self.fs, self.path(rel), spool, size, retry,
                             log=None if log is None else lambda uri: log.record(plain, rel, uri),
                             forget=None if log is None else lambda handle: log.forget(plain, handle))

    def cancel_session(self, uri: str) -> int:
        """Cancel a GCS resumable upload session (DELETE): 499 cancelled, 404/410 finished or expired."""
        return self._retry(lambda: gcs_resumable.cancel(self.fs, uri), f"cancelling an upload session to {self.url}")


def _local_root(url: str) -> str:
    """A local prefix as fsspec's LocalFileSystem names it (absolute, ~ expanded), found without fsspec."""
    path = url.split("://", 1)[1] if "://" in url else url
    return os.path.abspath(os.path.expanduser(path)).rstrip("/")


def _read_local(path: str, start: int | None, end: int | None) -> bytes:
    """Bytes [start, end) of a local file (whole when both are None), as LocalFileSystem.cat_file reads them."""
    with open(path, "rb") as f:
        if start:
            f.seek(start)
        return f.read() if end is None else f.read(end - (start or 0))


def _mtime_s(info: Mapping[str, Any]) -> float:
    """Modification time of an fsspec info dict: local `mtime`, S3 `LastModified`, memory `created`."""
    for key in ("mtime", "LastModified", "last_modified", "created", "updated"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return time.time()  # unknown: as young as can be, so gc never deletes it for its age


def _fsync_directory(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

