"""Azure Blob's conditional writes, for a destination's lease: If-None-Match: * creates, If-Match
replaces and deletes, the tag being the blob's ETag (Azure changes it with every write).

adlfs has no conditional writes, so these go through one synchronous azure-storage-blob client per
process (thread-safe; made after a fork, never inherited), its SDK retries off (retry_total=0): our
retry loop owns the budget. Everything else stays on adlfs.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataio.storage.options import StorageOptions

_CLIENTS: dict[tuple[int, StorageOptions], Any] = {}
_LOCK = threading.Lock()


def client_for(options: StorageOptions) -> Any:
    """This process's BlobServiceClient for `options`."""
    pid = os.getpid()
    with _LOCK:
        client = _CLIENTS.get((pid, options))
        if client is None:
            if any(p != pid for p, _ in _CLIENTS):
                _CLIENTS.clear()
            client = _CLIENTS[pid, options] = _make_client(options)
        return client


def _make_client(options: StorageOptions) -> Any:
    from azure.storage.blob import BlobServiceClient

    kwargs = {"retry_total": 0, "connection_timeout": options.connect_timeout_s,
              "read_timeout": options.read_timeout_s}
    if options.azure_connection_string:
        return BlobServiceClient.from_connection_string(options.azure_connection_string, **kwargs)
    if not options.azure_account_name:
        raise ValueError("an az:// store needs [azure] account_name (with account_key or sas_token) or "
                         "connection_string, or the AZURE_STORAGE_* variables")
    url = f"https://{options.azure_account_name}.blob.core.windows.net"
    credential: Any = None
    if options.azure_account_key:
        credential = {"account_name": options.azure_account_name, "account_key": options.azure_account_key}
    elif options.azure_sas_token:
        credential = options.azure_sas_token
    return BlobServiceClient(account_url=url, credential=credential, **kwargs)


def _blob(options: StorageOptions, path: str) -> Any:
    container, _, name = path.partition("/")
    return client_for(options).get_blob_client(container, name)


def _mapped(exc: Exception, path: str) -> Exception:
    """Azure's errors as fsspec raises them: a missing blob FileNotFoundError, a refused one PermissionError."""
    status = getattr(exc, "status_code", None)
    if status == 404:
        return FileNotFoundError(path)
    if status == 403:
        return PermissionError(f"{path}: {getattr(exc, 'error_code', None) or status}")
    return exc


def put_if(options: StorageOptions, path: str, data: bytes, *, etag: str | None = None) -> str | None:
    """Upload `data` only if no blob is there (etag None) or it still has `etag`: the new ETag, or None."""
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError

    condition: dict[str, Any] = ({"overwrite": False} if etag is None else
                                 {"overwrite": True, "etag": etag, "match_condition": MatchConditions.IfNotModified})
    try:
        out = _blob(options, path).upload_blob(data, **condition)
    except (ResourceExistsError, ResourceModifiedError):
        return None
    except HttpResponseError as exc:
        if exc.status_code in (409, 412):
            return None
        raise _mapped(exc, path) from exc
    return str(out["etag"])


def delete_if(options: StorageOptions, path: str, etag: str) -> bool:
    """Delete the blob only if it still has `etag`: True if deleted (or gone), False if it changed."""
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError

    try:
        _blob(options, path).delete_blob(etag=etag, match_condition=MatchConditions.IfNotModified)
    except ResourceNotFoundError:
        return True
    except ResourceModifiedError:
        return False
    except HttpResponseError as exc:
        if exc.status_code == 412:
            return False
        raise _mapped(exc, path) from exc
    return True


def get_tagged(options: StorageOptions, path: str) -> tuple[bytes, str] | None:
    """(bytes, ETag) of the blob from one GET; None if there is none."""
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

    try:
        downloader = _blob(options, path).download_blob()
        return downloader.readall(), str(downloader.properties.etag)
    except ResourceNotFoundError:
        return None
    except HttpResponseError as exc:
        raise _mapped(exc, path) from exc


def discard_uncommitted(options: StorageOptions, prefix_path: str, older_than_s: float) -> list[str]:
    """Discard the uncommitted blocks of blobs below `prefix_path` ("container/prefix") that have no
    committed version and were last touched more than `older_than_s` ago (an upload cut off); their
    names relative to the prefix. Azure deletes no uncommitted-only blob directly: an empty block list
    is committed (only where no blob was committed meanwhile: If-None-Match: *), then deleted by its ETag."""
    import time

    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError

    container, _, prefix = prefix_path.partition("/")
    prefix = prefix.rstrip("/") + "/"
    client = client_for(options).get_container_client(container)
    committed = {b.name for b in client.list_blobs(name_starts_with=prefix)}
    now, discarded = time.time(), []
    for blob in client.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"]):
        touched = blob.last_modified or blob.creation_time
        if blob.name in committed or (touched is not None and now - touched.timestamp() < older_than_s):
            continue
        handle = client.get_blob_client(blob.name)
        try:
            out = handle.commit_block_list([], headers={"If-None-Match": "*"})
            handle.delete_blob(etag=out["etag"], match_condition=MatchConditions.IfNotModified)
        except HttpResponseError as exc:
            if exc.status_code in (404, 409, 412):  # committed, or gone, meanwhile: not ours to touch
                continue
            raise _mapped(exc, blob.name) from exc
        discarded.append(blob.name[len(prefix):])
    return discarded
