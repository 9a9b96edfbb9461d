"""Ranged reads of S3 objects from many threads at once, with one thread-safe botocore client per process.

s3fs runs every request of a process on one asyncio event-loop thread, which parses every byte
of every body: reader threads then queue behind that one thread (small whole objects too: a burst
of a window's indexes and checksum sidecars waited on it). Measured against the local
SeaweedFS (2 cores, one process, 16 MB ranges, load 11-14): 180-290 MB/s through s3fs with 4-8
threads, 380-430 MB/s with botocore's own client, whose threads read their sockets in parallel
(the GIL is released in recv). Reads come here (ranged, and whole objects such as indexes);
everything else (listings, HEADs, writes) stays on s3fs. Errors are mapped to what s3fs raises (a missing
key is FileNotFoundError, a refused one PermissionError), so RetryPolicy judges them alike.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dataio.storage.options import StorageOptions
from dataio.storage.retry import ShortReadError

_CLIENTS: dict[tuple[int, StorageOptions], Any] = {}
_LOCK = threading.Lock()
# Connections the client pools per host: above any reader's threads (max_in_flight, hedges).
MAX_POOL_CONNECTIONS = 64


def available() -> bool:
    """True when botocore can be imported (the s3 extra installs it with s3fs)."""
    try:
        import botocore  # noqa: F401
    except ImportError:
        return False
    return True


def client_for(options: StorageOptions) -> Any:
    """This process's botocore S3 client for `options` (made once per process: not fork-safe)."""
    pid = os.getpid()
    with _LOCK:
        client = _CLIENTS.get((pid, options))
        if client is None:
            if any(p != pid for p, _ in _CLIENTS):  # a forked child: the parent's clients are not ours
                _CLIENTS.clear()
            client = _CLIENTS[pid, options] = _make_client(options)
        return client


def _make_client(options: StorageOptions) -> Any:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(
        connect_timeout=options.connect_timeout_s, read_timeout=options.read_timeout_s,
        retries={"total_max_attempts": 1, "mode": "standard"},  # our retry loop sits above
        max_pool_connections=MAX_POOL_CONNECTIONS,
        signature_version=UNSIGNED if options.anon else None,
    )
    session = boto3.session.Session()
    kwargs: dict[str, Any] = {"config": config}
    if options.endpoint_url:
        kwargs["endpoint_url"] = options.endpoint_url
    if options.region:
        kwargs["region_name"] = options.region
    if options.key and not options.anon:
        kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = options.key, options.secret
    return session.client("s3", **kwargs)


def read_range(options: StorageOptions, path: str, start: int | None, end: int | None) -> tuple[bytes, int | None]:
    """(bytes [start, end) of the object at `path` ("bucket/key"), the whole object when both are None;
    the object's whole size from the answer's Content-Range, None where it gives none); errors as
    s3fs raises them."""
    from botocore.exceptions import ClientError

    bucket, _, key = path.partition("/")
    ranged = {} if start is None and end is None else {"Range": f"bytes={start or 0}-{'' if end is None else end - 1}"}
    try:
        response = client_for(options).get_object(Bucket=bucket, Key=key, **ranged)
        total = _total_of(response.get("ContentRange")) if ranged else response.get("ContentLength")
        return response["Body"].read(), total
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchKey", "NoSuchBucket", "404") or status == 404:
            raise FileNotFoundError(path) from exc
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
            raise PermissionError(f"{path}: {code or status}") from exc
        if code == "InvalidRange" or status == 416:  # the object is shorter than the index says
            raise ShortReadError(f"the object ends before byte {start}") from exc
        raise


def _total_of(content_range: str | None) -> int | None:
    """The whole object's size from a Content-Range answer ("bytes 0-99/1234"); None if not stated."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None
