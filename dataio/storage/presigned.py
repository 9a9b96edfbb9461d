"""Presigned GET URLs of S3 objects and one urllib3 pool per process: how s3_into's GETs go out.

A GET through botocore's client costs ~4.5 ms of CPU (its event hooks, parameter checks, signing,
header parsing); the same ranged GET of a presigned URL through urllib3 ~1.3 ms (measured here, 200
requests each, load ~13 on 2 cores): at 8 MiB parts, ~0.54 vs ~0.16 CPU-seconds per GB. A Range
header is not part of a presigned URL's signature, so one URL per object serves every part of it.
URLs are signed by botocore's SigV4 query signer itself (0.4 ms), without a client: building one
took 0.44 s here (load ~11), inside a loader's first batch.
URLs are signed for an hour and used for URL_TTL_S; a 403 to an older one signs it again (s3_into),
so credentials that rotate (a session token) are picked up. Made once per process (fork-safe).
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.parse
from typing import Any

from dataio.storage import s3_ranges
from dataio.storage.options import StorageOptions

URL_TTL_S = 300.0  # a URL is signed again after this (it is valid for EXPIRES_S)
EXPIRES_S = 3600
FRESH_S = 5.0  # a URL younger than this is not signed again on a 403: the refusal is the store's answer

_LOCK = threading.Lock()
_URLS: dict[tuple[StorageOptions, str], tuple[str, float]] = {}
_POOLS: dict[StorageOptions, Any] = {}
_CHAIN: dict[str, Any] = {}  # botocore's default credential chain, found once per process
_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")  # served as BUCKET.s3.REGION.amazonaws.com
_PID = [os.getpid()]


def _own() -> None:
    """Forget a parent's URLs and pools in a forked child (hold _LOCK)."""
    if _PID[0] != os.getpid():
        _URLS.clear()
        _POOLS.clear()
        _CHAIN.clear()
        _PID[0] = os.getpid()


def url(options: StorageOptions, path: str) -> tuple[str, bool]:
    """A presigned GET URL of `path` ("bucket/key") and whether it was signed just now (FRESH_S)."""
    now = time.monotonic()
    with _LOCK:
        _own()
        found = _URLS.get((options, path))
    if found is not None and now - found[1] < URL_TTL_S:
        return found[0], now - found[1] < FRESH_S
    signed = sign_url(options, path)
    with _LOCK:
        if len(_URLS) > 100_000:  # a long job over millions of shards: keep the table bounded
            _URLS.clear()
        _URLS[options, path] = (signed, now)
    return signed, True


def sign_url(options: StorageOptions, path: str, query: str = "") -> str:
    """The URL of `path` ("bucket/key", or "bucket": the bucket itself, for a listing `query`) with a SigV4 query
    signature (botocore's signer, as its client's presigned URLs; no client: building one loads the whole S3
    service model, ~0.1-0.4 s of a loader's first batch)."""
    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest

    bucket, _, key = path.partition("/")
    env = os.environ  # where botocore's client looks when the options say nothing
    region = options.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = options.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    quoted = urllib.parse.quote(key, safe="/~")
    if endpoint:  # path style: what MinIO, SeaweedFS and Ceph serve without a DNS name per bucket
        base = f"{endpoint.rstrip('/')}/{bucket}/{quoted}"
    elif _DNS_BUCKET.fullmatch(bucket):
        base = f"https://{bucket}.s3.{region}.amazonaws.com/{quoted}"
    else:
        base = f"https://s3.{region}.amazonaws.com/{bucket}/{quoted}"
    base += f"?{query}" if query else ""
    if options.anon:
        return base
    credentials = _credentials(options)
    if credentials is None:
        raise PermissionError(f"{path}: no S3 credentials (give a key and secret, a config file, the AWS_* variables, "
                              "or anon for a public bucket)")
    request = AWSRequest(method="GET", url=base)
    S3SigV4QueryAuth(credentials, "s3", region, expires=EXPIRES_S).add_auth(request)
    return str(request.prepare().url)


def _credentials(options: StorageOptions) -> Any:
    """Frozen credentials: the options' key and secret, else botocore's default chain (as its client finds them)."""
    if options.key and options.secret:
        from botocore.credentials import Credentials

        return Credentials(options.key, options.secret)
    with _LOCK:
        _own()
        if "chain" not in _CHAIN:
            import botocore.session

            _CHAIN["chain"] = botocore.session.get_session().get_credentials()
        found = _CHAIN["chain"]
    return None if found is None else found.get_frozen_credentials()


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
