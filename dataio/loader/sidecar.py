"""The loader-state sidecar beside each trainer checkpoint (`ckpt-STEP.loader-state.json`): written,
sealed, read back and checked field by field, for `shardify which` and `--skip-steps`.

The sidecar is JSON: the loader state (with its run history), the step it was saved at, the
grad_accum, the data sources (redacted URLs; local paths absolute) and the directory the run
started in (`cwd`). Its `xxh3_128` seals the rest: the xxh3-128 of the document without that key
as `json.dumps(sort_keys=True)` writes it, so a digit changed by hand or by a damaged copy is
refused, naming the file, instead of naming another step's samples. Sidecars written before the
seal (or before `cwd`) still read: unsealed, and their relative paths resolved as
`resolve_sources` says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import xxhash

from dataio.errors import StateError
from dataio.format.schema import damage, typed
from dataio.storage.store import Store

SIDECAR_SUFFIX = ".loader-state.json"
SIDECAR_VERSION = 1
SEAL_KEY = "xxh3_128"

_FIELDS = {"shardify_loader_state": typed(int), "step": typed(int, ok=lambda v: v >= 0, says=">= 0"),
           "epoch": typed(int, ok=lambda v: v >= 0, says=">= 0"),
           "grad_accum": typed(int, ok=lambda v: v >= 1, says=">= 1"),
           "sources": typed(list, ok=lambda v: len(v) >= 1 and all(isinstance(s, dict) and isinstance(s.get("url"), str)
                                                                  for s in v), says="a list of {url, weight}"),
           "loader": typed(dict)}


def sidecar_doc(*, step: int, epoch: int, grad_accum: int, sources: Sequence[tuple[str, float | None]],
                loader_state: dict[str, Any], cwd: str | None = None) -> bytes:
    """The sidecar's bytes, sealed: `sources` are (redacted URL, weight) in the loader's order; a
    relative local path is stored absolute (against `cwd`, default the working directory)."""
    cwd = os.getcwd() if cwd is None else cwd
    doc = {"shardify_loader_state": SIDECAR_VERSION, "step": step, "epoch": epoch, "grad_accum": grad_accum,
           "sources": [{"url": absolute(u, cwd), "weight": w} for u, w in sources], "loader": loader_state,
           "cwd": cwd}
    doc = json.loads(json.dumps(doc))  # as a reader will see it (int keys become strings): what the seal covers
    return json.dumps({**doc, SEAL_KEY: _seal(doc)}, sort_keys=True).encode()


def _seal(doc: dict[str, Any]) -> str:
    return xxhash.xxh3_128(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def absolute(url: str, cwd: str) -> str:
    """A local path made absolute against `cwd`; a URL (scheme://...) as given."""
    return url if "://" in url else os.path.normpath(os.path.join(cwd, url))


def checked_sidecar(doc: Any, *, where: str = "the loader-state sidecar") -> dict[str, Any]:
    """`doc` when it is a complete, intact sidecar; StateError naming `where` and what is wrong."""
    if isinstance(doc, dict) and doc.get("shardify_loader_state") not in (None, SIDECAR_VERSION):
        raise StateError(f"{where}: loader-state sidecar version {doc.get('shardify_loader_state')!r} is not "
                         f"{SIDECAR_VERSION}: ask with the shardify that wrote it")
    why = damage(doc, _FIELDS)
    if why is not None:
        raise StateError(f"{where} is not a complete loader-state sidecar: {why}. Ask another checkpoint of the "
                         "run (each has its own sidecar), or restore this file from a copy")
    sealed = doc.get(SEAL_KEY)
    if sealed is not None:
        computed = _seal({k: v for k, v in doc.items() if k != SEAL_KEY})
        if computed != sealed:
            raise StateError(f"{where}: checksum mismatch (xxh3-128 {computed}, sealed {sealed}): the file changed "
                             "after the trainer wrote it, so the samples it would name cannot be trusted. Ask "
                             "another checkpoint of the run, or restore this file from a copy")
    return doc


def read_sidecar(store: Store, name: str) -> dict[str, Any]:
    """The checked sidecar `name` in `store`; StateError naming it when it is not JSON, incomplete or damaged."""
    where = store.url_of(name)
    try:
        doc = json.loads(store.read(name))
    except ValueError as exc:
        raise StateError(f"{where}: not valid JSON ({exc})") from None
    return checked_sidecar(doc, where=where)


def resolve_sources(doc: dict[str, Any], here: Store | None = None) -> dict[str, Any]:
    """`doc` with its relative local source paths made absolute: against the run's recorded `cwd`;
    a sidecar older than `cwd` is tried against the working directory, then each folder above the
    sidecar's own (`here`), the first holding the dataset's manifest.json winning."""
    sources = doc["sources"]
    if all("://" in s["url"] or os.path.isabs(s["url"]) for s in sources):
        return doc
    if isinstance(doc.get("cwd"), str):
        bases = [doc["cwd"]]
    else:
        bases = [os.getcwd()]
        if here is not None and here.is_local:
            folder = os.path.abspath(here.raw_url.removeprefix("file://"))
            while os.path.dirname(folder) != folder:
                folder = os.path.dirname(folder)
                bases.append(folder)
    out = []
    for s in sources:
        found = [absolute(s["url"], b) for b in bases]
        hit = next((f for f in found if os.path.exists(os.path.join(f, "manifest.json"))), found[0])
        out.append({**s, "url": hit})
    return {**doc, "sources": out}
