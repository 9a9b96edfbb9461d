"""GCS resumable uploads that shardify opens itself, so their session URIs can be recorded and cancelled.

gcsfs opens a resumable session for every upload of 50 MiB or more and never shows its URI: a writer
killed mid-upload leaves a session nobody can list, holding its bytes until GCS expires it a week
later. Here the session is opened (POST .../upload/storage/v1/b/BUCKET/o?uploadType=resumable, the URI
in the Location header), handed to a SessionLog before the first byte is sent, filled by PUTs of
chunks with Content-Range (308: go on from the Range the server states), and forgotten once the
object is complete or the session cancelled (DELETE: 499). A session URI carries an upload_id that
lets anyone holding it write the object: it is a secret (dataio.storage.redact removes it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

# Every chunk but the last must be a multiple of 256 KiB (GCS refuses others).
CHUNK_BYTES = 16 << 20
_QUANTUM = 256 << 10
# Answers to a DELETE of a session that mean it is gone: cancelled (499, as documented), or already
# finished or expired (404, 410).
GONE = (499, 404, 410)

# Runs one request under the upload's retry policy: retry(fn, what) -> fn's result.
Retry = Callable[[Callable[[], Any], str], Any]


class SessionLog(Protocol):
    """Where a writer records the sessions it opens (dataio.format.versions.JournalSessions)."""

    def record(self, store: Any, rel: str, uri: str) -> str:
        """Durably note that `uri` uploads `rel`; returns a handle for forget()."""
        ...

    def forget(self, store: Any, handle: str) -> None:
        """The session is finished or cancelled: drop its record."""
        ...


def start(fs: Any, path: str, generation: str | None = None) -> str:
    """Open a resumable session for `path` ("bucket/key"), only if its generation is `generation` where
    given ("0": no object there); the session URI."""
    bucket, key, _ = fs.split_path(path)
    params = {"uploadType": "resumable", "name": key}
    if generation is not None:
        params["ifGenerationMatch"] = generation
    headers, _ = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o", json={"name": key},
                         headers={"X-Upload-Content-Type": "application/octet-stream"}, **params)
    uri = headers.get("Location") or headers.get("location")
    if not uri:
        raise OSError("GCS opened no resumable session (no Location header in its answer)")
    return str(uri[0] if isinstance(uri, list) else uri)


def _request(fs: Any, method: str, uri: str, **kwargs: Any) -> tuple[int, Any]:
    """(status, headers) of one request through gcsfs's authenticated session (errors raised as gcsfs raises
    them: 404 FileNotFoundError, others HttpError with .code; 308 and 499 pass)."""
    from fsspec.asyn import sync

    status, headers, _, _ = sync(fs.loop, fs._request, method, uri, **kwargs)
    return int(status), headers


def _persisted(headers: Any) -> int:
    """How many bytes a 308 answer says the session holds (no Range header: none)."""
    stated = headers.get("Range") or headers.get("range")
    return int(str(stated).rsplit("-", 1)[1]) + 1 if stated else 0


def _put(fs: Any, uri: str, spool: Any, offset: int, size: int, chunk_bytes: int) -> int | None:
    """Send bytes [offset, offset + chunk) of the spool; the bytes the session now holds (None: complete)."""
    spool.seek(offset)
    piece = spool.read(min(chunk_bytes, size - offset))
    last = offset + len(piece) - 1
    status, headers = _request(fs, "PUT", uri, data=piece,
                               headers={"Content-Range": f"bytes {offset}-{last}/{size}",
                                        "Content-Type": "application/octet-stream"})
    return _held(status, headers)


def _status(fs: Any, uri: str, size: int) -> int | None:
    """Ask the session how many bytes it holds (PUT with `bytes */size`); None: it is complete."""
    status, headers = _request(fs, "PUT", uri, data=b"", headers={"Content-Range": f"bytes */{size}"})
    return _held(status, headers)


def _held(status: int, headers: Any) -> int | None:
    """None when the answer says the object is complete (200, 201), else the bytes held (308)."""
    if status in (200, 201):
        return None
    if status != 308:
        raise OSError(f"a resumable upload's PUT was answered {status}, not 200, 201 or 308")
    return _persisted(headers)


def send(fs: Any, uri: str, spool: Any, size: int, retry: Retry, chunk_bytes: int | None = None) -> None:
    """Fill the session with the spool's `size` bytes, chunk by chunk, each retried through `retry`; a
    retried chunk first asks the session where it stands, and goes on from there."""
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if chunk_bytes % _QUANTUM:
        raise ValueError(f"a resumable upload's chunks are multiples of {_QUANTUM} bytes, not {chunk_bytes}")
    offset: int | None = 0
    while offset is not None:
        tries = [0]

        def once(at: int = offset) -> int | None:
            tries[0] += 1
            if tries[0] > 1:  # a try failed: the session may hold some of the chunk already
                at_now = _status(fs, uri, size)
                if at_now is None:
                    return None
                at = at_now
            return _put(fs, uri, spool, at, size, chunk_bytes)

        offset = retry(once, f"bytes from {offset}")
        if offset is not None and offset >= size:  # every byte held, yet no object: ask once more
            offset = retry(lambda: _status(fs, uri, size), "the upload's status")


def cancel(fs: Any, uri: str) -> int:
    """Cancel a session (DELETE); the status: 499 cancelled, 404/410 finished or expired already."""
    try:
        status, _ = _request(fs, "DELETE", uri)
    except FileNotFoundError:
        return 404
    except Exception as exc:
        code = getattr(exc, "code", None)
        if code in GONE:
            return int(code)
        raise
    return status  # 499 (gcsfs passes it through without raising) or, from some servers, a 2xx


def upload(fs: Any, path: str, spool: Any, size: int, retry: Retry, *, log: Callable[[str], str] | None = None,
           forget: Callable[[str], None] | None = None, generation: str | None = None,
           chunk_bytes: int | None = None) -> None:
    """One resumable upload of the spool to `path`: the session opened, recorded through `log` before the
    first byte, filled, then forgotten; on failure cancelled (best effort) and forgotten."""
    uri = retry(lambda: start(fs, path, generation), "opening a resumable upload")
    handle = None
    try:
        handle = log(uri) if log is not None else None  # before the first byte: a kill leaves it recorded
        send(fs, uri, spool, size, retry, chunk_bytes)
    except BaseException:
        with contextlib.suppress(Exception):
            cancel(fs, uri)
        _forget(forget, handle)
        raise
    _forget(forget, handle)


def _forget(forget: Callable[[str], None] | None, handle: str | None) -> None:
    if forget is not None and handle is not None:
        with contextlib.suppress(Exception):  # a record left behind costs gc one DELETE answered 404
            forget(handle)
