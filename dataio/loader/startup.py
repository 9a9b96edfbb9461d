"""The loader's start-up: opening and checking the dataset, the ranks' agreement on it.

Agreement goes through torch.distributed's key-value store (passed in by make_loader, the one
place that reads torch.distributed) with a timeout, so a rank that cannot open the dataset (or
opens a different one) makes every rank fail at once instead of hanging.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dataio.decode.images import IMAGE_EXTS, order_image_fields
from dataio.errors import ManifestError, ShardifyError
from dataio.format.manifest import Manifest, label_field, read_manifest
from dataio.readers.base import check_fields
from dataio.storage.store import Store

if TYPE_CHECKING:
    from dataio.loader.config import LoaderConfig


def agree_on_dataset(
    open_dataset: Any, *, rank: int, world_size: int, timeout_s: float, kv_store: Any
) -> Any:
    """Run `open_dataset() -> (result, fingerprint)` on every rank and check they all got the same.

    Each rank publishes its fingerprint, or its error, under a key of its own, then waits for all
    the others: a rank that failed raises its own error; the others raise one naming it.
    """
    kv = kv_store  # torch.distributed's Store API: add, set, get, wait, check
    # Every rank starts its loaders in the same order: the n-th loader of each rank meets the
    # n-th of the others. The counter lives in the store, one per rank, so nothing is global here.
    call = kv.add(f"shardify/loader/calls/{rank}", 1)
    prefix = f"shardify/loader/{call}"
    try:
        result, fingerprint = open_dataset()
    except BaseException as exc:
        kv.set(f"{prefix}/{rank}", f"error:{type(exc).__name__}: {exc}"[:2000])
        raise
    kv.set(f"{prefix}/{rank}", f"ok:{fingerprint}")
    keys = [f"{prefix}/{r}" for r in range(world_size)]
    try:
        kv.wait(keys, timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - the store raises its own timeout types
        waiting = [r for r in range(world_size) if not kv.check([keys[r]])]
        raise ShardifyError(
            f"rank {rank}: ranks {waiting} did not open the dataset within {timeout_s:.0f} s ({exc}); "
            "check that every rank can reach the dataset URL"
        ) from None
    values = {r: kv.get(keys[r]).decode() for r in range(world_size)}
    for r, value in values.items():
        if value.startswith("error:"):
            raise ShardifyError(f"rank {rank}: rank {r} could not open the dataset: {value[6:]}")
    mismatched = {r: v[3:] for r, v in values.items() if v[3:] != fingerprint}
    if mismatched:
        raise ManifestError(
            f"rank {rank}: ranks see different datasets: fingerprint {fingerprint} here, "
            f"{mismatched} elsewhere; point every rank at the same dataset URL"
        )
    return result


def open_dataset(url: str, config: LoaderConfig) -> tuple[Store, Manifest]:
    """The Store and its manifest, with the start-up checks; ManifestError names the URL and the fix.

    One request for a single-file manifest (a few for a parted one), whatever the dataset's size:
    the listing that finds missing shards runs later, beside the first batches (ShardCheck).
    """
    store = Store(url, config.storage)
    manifest = read_manifest(store.first_request())  # a stuck endpoint fails within 30 s
    if manifest.format == "tokens":  # read by the token loader (loader/token_data.py), given seq_len
        raise ManifestError(f"{store.url}: a token dataset (manifest format 'tokens'): pass seq_len= (and "
                            "packing=) to make_loader for batches of packed sequences")
    check_fields(manifest, config.fields)
    return store, manifest


def check_shards_present(store: Store, manifest: Manifest) -> None:
    """ManifestError unless every shard (and tar index) the manifest names is listed below the prefix.

    A parted manifest (past 10k shards) is not listed: every rank listing millions of objects is
    the thundering herd it exists to avoid; a missing shard still fails when read, naming it.
    """
    if not manifest.num_shards or manifest.parted is not None:
        return
    present = set(store.list())
    needed = list(manifest.shard_paths) + list(manifest.index_paths if manifest.format == "tar" else ())
    missing = [p for p in needed if p not in present]
    if missing:
        raise ManifestError(
            f"{store.url}: {len(missing)} file(s) listed in the manifest are missing, e.g. "
            f"{[store.url_of(p) for p in missing[:3]]}; restore them or rewrite the dataset "
            "(check_shards=False skips this listing)"
        )


class ShardCheck:
    """check_shards_present for every opened dataset, in a background thread started once the
    first batch is out: the listing grows with the dataset, so it stays off the first batch's path.

    `start()` after the first batch; `poll()` at every batch raises the check's error once it has
    one; `finish()` at the epoch's end waits for it. A check that passed is never run again.
    """

    def __init__(self, datasets: list[tuple[Store, Manifest]], *, enabled: bool) -> None:
        self._datasets = datasets if enabled else []
        self._thread: threading.Thread | None = None
        self._error: list[BaseException] = []
        self._done = not self._datasets

    def _run(self) -> None:
        try:
            for store, manifest in self._datasets:
                check_shards_present(store, manifest)
        except BaseException as exc:  # noqa: BLE001 - raised in the consuming thread by poll()
            self._error.append(exc)

    def start(self) -> None:
        if self._done or self._thread is not None:
            return
        self._error.clear()
        self._thread = threading.Thread(target=self._run, name="dataio-shard-check", daemon=True)
        self._thread.start()

    def poll(self, *, wait: bool = False) -> None:
        """Raise the check's error if it has finished with one (wait=True: wait for it first)."""
        thread = self._thread
        if thread is None or (thread.is_alive() and not wait):
            return
        thread.join()
        self._thread = None
        if self._error:
            raise self._error[0]  # the check stays pending: a new iteration lists again
        self._done = True

    def finish(self) -> None:
        self.poll(wait=True)


def image_fields_of(manifest: Manifest) -> tuple[str, ...]:
    """Every image field of the dataset, in the order a sample's image is picked (IMAGE_FIELD_ORDER)."""
    names = [f.name for f in manifest.fields if f.type == "image"]
    names += [n for n in manifest.field_names if n in IMAGE_EXTS and n not in names]
    return order_image_fields(names)


def fields_to_read(manifest: Manifest, config: LoaderConfig, url: str) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """(image fields, reader projection): each sample's image is the first of its image fields it
    has (see dataio.decode.images.IMAGE_FIELD_ORDER); a projection keeps the label field."""
    names = image_fields_of(manifest)
    fields = config.fields
    if fields is not None:
        names = tuple(n for n in names if n in fields)
        label = label_field(manifest)
        if label in manifest.field_names and label not in fields:
            fields = (*fields, label)  # the label is part of every batch
    if config.decode is not None and not names:
        raise ValueError(
            f"{url}: decode={config.decode!r} but no image field is read (dataset fields "
            f"{list(manifest.field_names)}, fields={config.fields}); pass decode=None for raw fields"
        )
    return names, fields
