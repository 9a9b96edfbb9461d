"""Uploads to an object store that the store must confirm: the multipart upload and the HEAD after.

Store.open_atomic collects an object's bytes, then each try of its upload sends all of them (one
PUT, or a multipart upload whose parts are each retried within the upload's budget) and checks
with a HEAD that the store holds that size and, where it gives an ETag of the usual form, the
ETag computed from the bytes sent (MD5 for one PUT, MD5 of the parts' MD5s and "-N" for N parts).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

from dataio.storage.retry import UnconfirmedWriteError

# Runs one part's upload under the retry policy: retry(fn, what) -> fn's result.
PartRetry = Callable[[Callable[[], dict[str, Any]], str], dict[str, Any]]


def upload_parts(fs: Any, path: str, spool: Any, part_bytes: int, retry: PartRetry) -> str:
    """A multipart upload of the spool (from its position), each part retried through `retry` until its
    ETag is the MD5 of the bytes sent; returns the ETag the whole object must then have. Aborted
    (nothing appears) on any failure."""
    bucket, key, _ = fs.split_path(path)
    upload_id = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    digests: list[bytes] = []
    parts: list[dict[str, Any]] = []
    try:
        while piece := spool.read(part_bytes):
            number, digest = len(parts) + 1, hashlib.md5(piece, usedforsecurity=False)

            def put(piece: bytes = piece, number: int = number, digest: Any = digest) -> dict[str, Any]:
                out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id,
                                 PartNumber=number, Body=piece)
                etag = str(out.get("ETag") or "").strip('"').lower()
                if is_md5(etag) and etag != digest.hexdigest():
                    raise UnconfirmedWriteError(f"the store's ETag {etag} of part {number} is not the MD5 "
                                                f"{digest.hexdigest()} of the bytes sent")
                return out

            out = retry(put, f"part {number}")
            digests.append(digest.digest())
            parts.append({"PartNumber": number, "ETag": out["ETag"]})
        fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                   MultipartUpload={"Parts": parts})
    except BaseException:
        with contextlib.suppress(Exception):
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        raise
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(parts)}"


def confirm(fs: Any, path: str, url: str, size: int, etag_sent: str) -> None:
    """HEAD the object just written at `path` (`url` in messages): the expected size, and the ETag where
    the store gives one of the usual form (MD5 of the bytes for one PUT, MD5 of the part MD5s and "-N"
    for a multipart upload); a store that gives another form (or none) is checked on size only."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise UnconfirmedWriteError(f"the store accepted the upload but has no object at {url}") from None
    got = int(info.get("size", -1))
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
    if got != size:
        raise UnconfirmedWriteError(f"the store holds {got} bytes, {size} were written")
    if _same_form(etag, etag_sent) and etag != etag_sent:
        # Other bytes than ours were stored (changed after they were checksummed): readers must
        # not find them, whatever the next try does.
        with contextlib.suppress(Exception):
            fs.rm_file(path)
        raise UnconfirmedWriteError(f"the store's ETag {etag} is not {etag_sent}, that of the bytes written")


def is_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)


def _same_form(etag: str, expected: str) -> bool:
    """True when the store's ETag is of the form computed locally (plain MD5, or MD5-N of a multipart upload)."""
    if "-" in expected:
        head, _, count = etag.partition("-")
        return is_md5(head) and count == expected.partition("-")[2]
    return is_md5(etag)


def size_and_md5(f: Any) -> tuple[int, str]:
    """The size and MD5 (hex) of a file object's whole content."""
    f.seek(0)
    h = hashlib.md5(usedforsecurity=False)
    size = 0
    while piece := f.read(8 << 20):
        h.update(piece)
        size += len(piece)
    return size, h.hexdigest()
