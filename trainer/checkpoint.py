"""Checkpoints: one file per save, published atomically, sealed by a checksum, on a local path or any fsspec URL.

A checkpoint holds model, optimizer, LR schedule, grad scaler, step/epoch, every rank's RNG
states and the loader state. Files are named ckpt-STEP.pt and only ever appear complete
(Store.open_atomic: temp + fsync + rename locally; on object stores an upload that a HEAD
confirms by size and ETag), so the newest name is the newest complete checkpoint. A save that
fails for any reason (disk full, permission, the store refusing it) raises CheckpointWriteError;
the trainer reports it, does not record it, and trains on. Loading uses
torch.load(weights_only=True): no arbitrary unpickling.

The seal: a file is torch.save's zip archive whose end record carries, as the archive comment,
`shardify-checkpoint xxh3-128=HEX` over every byte before the comment's length field. The comment
is part of the same file, so it is published atomically with it, and the file stays a plain
torch.save archive (torch.load and zipfile read it as is). Loading verifies the seal first: a
file damaged after it was written (bits flipped at the same size) is refused naming it, and
`--resume auto` falls back to the previous checkpoint.
"""

from __future__ import annotations

import io
import random
import re
import struct
from typing import Any

import numpy as np
import torch
import xxhash

from dataio.errors import ShardifyError
from dataio.loader.which import SIDECAR_SUFFIX
from dataio.storage.store import Store

FORMAT_VERSION = 2  # 2: sealed by a checksum; 1 (older trainers): the same payload, unsealed
_READS = (1, 2)
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
_SEAL = b"shardify-checkpoint xxh3-128="
_SEAL_BYTES = len(_SEAL) + 32  # the comment: prefix and 32 hex digits
_END_RECORD_BYTES = 22  # a zip's end-of-central-directory record without its comment


class CheckpointMismatch(ValueError):
    """A checkpoint was written by another model, dataset or trainer version."""


class CheckpointUnreadable(CheckpointMismatch):
    """A checkpoint's bytes do not load (truncated, damaged, or not a checkpoint at all)."""


class CheckpointWriteError(Exception):
    """A checkpoint could not be stored (disk full, permission, the store refused it); nothing was published."""


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


def list_checkpoints(store: Store) -> list[str]:
    """Names of complete checkpoints in `store`, oldest first."""
    names = [n for n in store.list() if _NAME.match(n)]
    return sorted(names, key=lambda n: int(_NAME.match(n).group(1)))  # type: ignore[union-attr]


def save(store: Store, step: int, payload: dict[str, Any], *, keep: int) -> tuple[str, str]:
    """Publish payload as ckpt-STEP.pt atomically and sealed, then drop all but the newest `keep`;
    returns (URL, checksum). CheckpointWriteError, naming the URL and the cause, if it was not stored."""
    name = checkpoint_name(step)
    sealer: _Sealer | None = None
    try:
        with store.open_atomic(name) as f:
            sealer = _Sealer(f)
            try:
                torch.save({"format_version": FORMAT_VERSION, **payload}, sealer)
            except RuntimeError:
                # torch reports a failed write as "[enforce fail at inline_container.cc]"; the
                # OSError underneath (no space left, permission) is what the user can act on.
                if sealer.error is not None:
                    raise sealer.error from None
                raise
            sealer.seal()
    except Exception as exc:  # noqa: BLE001 - any failure to store it: reported by the caller, never fatal
        raise CheckpointWriteError(f"{store.url_of(name)}: {_why(exc)}") from None
    try:
        for old in list_checkpoints(store)[:-keep]:
            store.remove(old)
            if store.exists(sidecar_name(old)):
                store.remove(sidecar_name(old))
    except (ShardifyError, OSError):
        pass  # the new checkpoint is stored; the next save prunes what this one could not
    return store.url_of(name), sealer.checksum


def sidecar_name(name: str) -> str:
    """The loader-state sidecar beside checkpoint `name`: ckpt-STEP.pt -> ckpt-STEP.loader-state.json."""
    return name[:-len(".pt")] + SIDECAR_SUFFIX


def save_sidecar(store: Store, step: int, data: bytes) -> None:
    """Publish the loader state beside ckpt-STEP.pt as JSON (`shardify which` reads it without torch);
    CheckpointWriteError, naming the URL, if it was not stored."""
    name = sidecar_name(checkpoint_name(step))
    try:
        with store.open_atomic(name) as f:
            f.write(data)
    except Exception as exc:  # noqa: BLE001 - reported by the caller, never fatal
        raise CheckpointWriteError(f"{store.url_of(name)}: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    """A write failure in words: the OS's reason for an OSError (ENOSPC: 'No space left on device')."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({type(exc).__name__}, errno {exc.errno})"
    return f"{type(exc).__name__}: {exc}"


class _Sealer:
    """The file torch.save writes into: passes its bytes on to `f`, hashing them, and holds back the
    zip's end record so `seal` can write it with the checksum as the archive comment."""

    def __init__(self, f: Any) -> None:
        self.f, self.hash, self.tail = f, xxhash.xxh3_128(), b""
        self.error: OSError | None = None  # the first failed write: torch replaces it by a RuntimeError
        self.checksum = ""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n >= _END_RECORD_BYTES:
            self._emit(self.tail)
            self._emit(view[:n - _END_RECORD_BYTES])
            self.tail = bytes(view[n - _END_RECORD_BYTES:])
        else:
            joined = self.tail + bytes(view)
            self._emit(joined[:-_END_RECORD_BYTES])
            self.tail = joined[-_END_RECORD_BYTES:]
        return n

    def flush(self) -> None:
        self.f.flush()

    def _emit(self, chunk: Any) -> None:
        if not len(chunk):
            return
        self.hash.update(chunk)
        try:
            self.f.write(chunk)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def seal(self) -> None:
        """Write the held-back end record with the comment `shardify-checkpoint xxh3-128=HEX`."""
        # The end record: signature, 16 bytes of counts and offsets, then the comment's length (0).
        if len(self.tail) != _END_RECORD_BYTES or not self.tail.startswith(b"PK\x05\x06") or self.tail[-2:] != b"\0\0":
            raise RuntimeError("torch.save did not end with a plain zip end record; cannot seal the checkpoint")
        self._emit(self.tail[:-2])
        self.checksum = self.hash.hexdigest()
        comment = _SEAL + self.checksum.encode()
        self.f.write(struct.pack("<H", len(comment)) + comment)


def verify(data: bytes, *, where: str) -> bool:
    """Check a checkpoint's seal: True if sealed and intact, False if unsealed (an older trainer's);
    CheckpointUnreadable naming `where` if the bytes no longer match their checksum."""
    comment, length = data[-_SEAL_BYTES:], data[-_SEAL_BYTES - 2:-_SEAL_BYTES]
    if not comment.startswith(_SEAL) or length != struct.pack("<H", _SEAL_BYTES):
        return False
    stored = comment[len(_SEAL):].decode("ascii", "replace")
    computed = xxhash.xxh3_128(memoryview(data)[:-_SEAL_BYTES - 2]).hexdigest()
    if computed != stored:
        raise CheckpointUnreadable(f"{where}: checksum mismatch (xxh3-128 {computed}, sealed {stored}): the file "
                                   "changed after it was written (a damaged disk, copy or upload)")
    return True


def locate(resume: str, store: Store, options: Any) -> tuple[Store, str] | None:
    """(store, name) of the checkpoint to resume from: newest in `store` for "auto", a given one, or None."""
    if resume == "none":
        return None
    if resume == "auto":
        names = list_checkpoints(store)
        return (store, names[-1]) if names else None
    parent, _, name = resume.rstrip("/").rpartition("/")
    where = Store(parent or ".", options)
    if not where.exists(name):
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint; use --resume auto or none")
    return where, name


def load(store: Store, name: str) -> dict[str, Any]:
    """Read a checkpoint onto the CPU after verifying its seal; refuses other format versions, and a
    current-format file whose seal is missing."""
    data = store.read(name)
    where = store.url_of(name)
    sealed = verify(data, where=where)
    try:
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not our checkpoint"
        raise CheckpointUnreadable(f"{where} is not a readable trainer checkpoint ({exc})") from None
    version = ckpt.get("format_version") if isinstance(ckpt, dict) else None
    if version not in _READS:
        raise CheckpointMismatch(f"{where}: checkpoint format {version!r}, this trainer reads {list(_READS)}; "
                                 "use --resume none")
    if version >= 2 and not sealed:
        raise CheckpointUnreadable(f"{where}: its checksum seal is missing or damaged, so its bytes cannot be "
                                   "verified")
    return ckpt


def load_newest_complete(store: Store) -> tuple[str, dict[str, Any], list[str]] | None:
    """(name, checkpoint, skipped) of the newest checkpoint in `store` that loads, or None if none
    exist; `skipped` says which newer ones did not load and why (a truncated or damaged file)."""
    names = list_checkpoints(store)
    skipped: list[str] = []
    for name in reversed(names):
        try:
            return name, load(store, name), skipped
        except (CheckpointUnreadable, ShardifyError) as exc:  # other format versions still stop here
            skipped.append(f"{name}: {exc}")
    if names:
        raise CheckpointUnreadable(f"--resume auto: none of the {len(names)} checkpoints in {store.url} loads "
                                   f"({'; '.join(skipped[:3])}); use --resume none or restore a checkpoint")
    return None


def check_identity(ckpt: dict[str, Any], identity: dict[str, Any], *, where: str, sources_added: int = 0) -> None:
    """Refuse a checkpoint of another model, class count or dataset, saying which and what to do.
    sources_added > 0: the loader found the saved mixture's sources first in this run's scheduled
    mixture (sources appended on resume), so the data is judged by the loader, not by its identity."""
    saved = ckpt.get("identity", {})
    for key, value in identity.items():
        if key == "dataset" and sources_added:
            continue
        if saved.get(key) != value:
            raise CheckpointMismatch(
                f"checkpoint {where} was written with {key}={saved.get(key)!r}, this run has {key}={value!r}; "
                "resume with the same --model/--data, or start fresh with --resume none "
                "(or another --checkpoint-dir)"
            )


def rng_state() -> dict[str, Any]:
    """This process's RNG states in a weights_only-loadable form."""
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _tuples(value: Any) -> Any:
    """random.setstate wants tuples; a save/load round trip may give lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
