"""Presigned GET URLs of S3 objects and one urllib3 pool per process: how s3_into's ranged GETs go out.

A GET through botocore's client costs ~4.5 ms of CPU (its event hooks, parameter checks, signing,
header parsing); the same ranged GET of a presigned URL through urllib3 ~1.3 ms (measured here, 200
requests each, load ~13 on 2 cores): at 8 MiB parts, ~0.54 vs ~0.16 CPU-seconds per GB. A Range
header is not part of a presigned URL's signature, so one URL per object serves every part of it.
URLs are signed for an hour and used for URL_TTL_S; a 403 to an older one signs it again (s3_into),
so credentials that rotate (a session token) are picked up. Made once per process (fork-safe).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from dataio.storage import s3_ranges
from dataio.storage.options import StorageOptions

URL_TTL_S = 300.0  # a URL is signed again after this (it is valid for EXPIRES_S)
EXPIRES_S = 3600
FRESH_S = 5.0  # a URL younger than this is not signed again on a 403: the refusal is the store's answer

_LOCK = threading.Lock()
_URLS: dict[tuple[StorageOptions, str], tuple[str, float]] = {}
_POOLS: dict[StorageOptions, Any] = {}
_PID = [os.getpid()]


def _own() -> None:
    """Forget a parent's URLs and pools in a forked child (hold _LOCK)."""
    if _PID[0] != os.getpid():
        _URLS.clear()
        _POOLS.clear()
        _PID[0] = os.getpid()


def url(options: StorageOptions, path: str) -> tuple[str, bool]:
    """A presigned GET URL of `path` ("bucket/key") and whether it was signed just now (FRESH_S)."""
    now = time.monotonic()
    with _LOCK:
        _own()
        found = _URLS.get((options, path))
    if found is not None and now - found[1] < URL_TTL_S:
        return found[0], now - found[1] < FRESH_S
    bucket, _, key = path.partition("/")
    signed = s3_ranges.client_for(options).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=EXPIRES_S)
    with _LOCK:
        if len(_URLS) > 100_000:  # a long job over millions of shards: keep the table bounded
            _URLS.clear()
        _URLS[options, path] = (signed, now)
    return signed, True


def forget(options: StorageOptions, path: str) -> None:
    with _LOCK:
        _URLS.pop((options, path), None)


def pool(options: StorageOptions) -> Any:
    """This process's urllib3 PoolManager for `options`: its timeouts, s3_ranges' pool size, the CA bundle
    botocore would use (AWS_CA_BUNDLE, else its own)."""
    with _LOCK:
        _own()
        found = _POOLS.get(options)
        if found is None:
            import urllib3
            from botocore.httpsession import get_cert_path

            found = _POOLS[options] = urllib3.PoolManager(
                maxsize=s3_ranges.MAX_POOL_CONNECTIONS, retries=False,
                timeout=urllib3.Timeout(connect=options.connect_timeout_s, read=options.read_timeout_s),
                cert_reqs="CERT_REQUIRED", ca_certs=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True))
        return found
