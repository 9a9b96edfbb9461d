"""Google Cloud Storage through gcsfs's core filesystem, and the generation-conditional writes a
destination's lease needs (ifGenerationMatch=0 creates; ifGenerationMatch=G replaces and deletes).

gcsfs.GCSFileSystem is, by default since 2025, an "extended" class that first asks the gRPC
storage-control API what kind of bucket it is (zonal, hierarchical): one more request at start-up,
and 60 s of retries against an endpoint without that API (fake-gcs-server; a proxy). Standard
buckets need none of it, so Stores open gcsfs.core.GCSFileSystem: the JSON API only.
Every object's tag is its generation, which GCS changes with every write of that name.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from dataio.errors import StorageError

_CHANGED = (412, 409)  # precondition failed; a conflicting concurrent request


def open_fs(url: str, kwargs: dict[str, Any]) -> tuple[Any, str]:
    """(gcsfs's core filesystem for `kwargs`, the path of `url` on it, "bucket/key"); StorageError naming a
    credentials file (the token) that is missing or that Google's libraries cannot use."""
    from gcsfs.core import GCSFileSystem

    token = kwargs.get("token")
    is_file = isinstance(token, str) and (os.path.exists(token) or token.endswith(".json"))
    if is_file and not os.path.isfile(token):  # gcsfs would take the path for a raw access token
        raise StorageError(f"{token}: no such Google credentials file (the GCS token); give the path of a "
                           "service-account key or an authorized-user JSON file")
    try:
        return GCSFileSystem(**kwargs), GCSFileSystem._strip_protocol(url)
    except Exception as exc:  # noqa: BLE001 - google-auth raises KeyError, ValueError, ... on a malformed file
        if not is_file:
            raise
        why = f"no {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise StorageError(f"{token}: not a usable Google credentials file ({why}); give a service-account key "
                           "(JSON with \"type\": \"service_account\", from the Cloud console) or an authorized-user "
                           "file (`gcloud auth application-default login`)") from None


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, FileExistsError):  # gcsfs maps 412 on a create to this
        return 412
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def put_if(fs: Any, path: str, data: bytes, generation: str) -> str | None:
    """Upload `data` to `path` only if its generation is `generation` ("0": no object there): the new
    generation, or None when the condition did not hold."""
    bucket, key, _ = fs.split_path(path)
    # A multipart upload (metadata, then bytes) as gcsfs sends: fake-gcs-server checks the
    # precondition on this form only (GCS on every form).
    body = (b'--==0==\nContent-Type: application/json; charset=UTF-8\n\n' + json.dumps({"name": key}).encode()
            + b"\n--==0==\nContent-Type: application/octet-stream\n\n" + data + b"\n--==0==--")
    try:
        out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o", uploadType="multipart",
                      ifGenerationMatch=generation, data=body, json_out=True,
                      headers={"Content-Type": 'multipart/related; boundary="==0=="'})
    except Exception as exc:
        if _status(exc) in _CHANGED:
            return None
        raise
    fs.invalidate_cache(path)
    return str(out["generation"])


def delete_if(fs: Any, path: str, generation: str) -> bool:
    """Delete `path` only if its generation is still `generation`: True if deleted (or gone), False if changed."""
    bucket, key, _ = fs.split_path(path)
    try:
        fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=generation)
    except FileNotFoundError:  # gone; or (fake-gcs-server) no object of that generation
        fs.invalidate_cache(path)
        return not fs.exists(path)
    except Exception as exc:
        if _status(exc) in _CHANGED:
            return False
        raise
    fs.invalidate_cache(path)
    return True


def get_tagged(fs: Any, path: str) -> tuple[bytes, str] | None:
    """(bytes, generation) of the object at `path` from one GET; None if there is none."""
    bucket, key, _ = fs.split_path(path)
    try:
        headers, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media")
    except FileNotFoundError:
        return None
    generation = headers.get("x-goog-generation") or headers.get("X-Goog-Generation")
    assert generation, "GCS answers a media GET with x-goog-generation"
    return bytes(data), str(generation)


def stat(fs: Any, path: str) -> dict[str, Any]:
    """The object's metadata (size, md5Hash, generation) from one GET: gcsfs's info() also lists the
    name as a folder, in parallel, which a start-up without listings cannot afford."""
    bucket, key, _ = fs.split_path(path)
    out = fs.call("GET", "b/{}/o/{}", bucket, key, json_out=True)
    out["size"] = int(out.get("size") or 0)
    return dict(out)
