"""Checkpoints: one file per save, published atomically, on a local path or any fsspec URL.

A checkpoint holds model, optimizer, LR schedule, grad scaler, step/epoch, every rank's RNG
states and the loader state. Files are named ckpt-STEP.pt and only ever appear complete
(Store.open_atomic: temp + fsync + rename locally; on object stores an upload that a HEAD
confirms by size and ETag), so the newest name is the newest complete checkpoint. A save the
store does not confirm raises StorageError; the trainer then reports it and does not record it. Loading uses torch.load(weights_only=True): no arbitrary
unpickling.
"""

from __future__ import annotations

import io
import random
import re
from typing import Any

import numpy as np
import torch

from dataio.errors import ShardifyError
from dataio.storage.store import Store

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")


class CheckpointMismatch(ValueError):
    """A checkpoint was written by another model, dataset or trainer version."""


class CheckpointUnreadable(CheckpointMismatch):
    """A checkpoint's bytes do not load (truncated, damaged, or not a checkpoint at all)."""


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


def list_checkpoints(store: Store) -> list[str]:
    """Names of complete checkpoints in `store`, oldest first."""
    names = [n for n in store.list() if _NAME.match(n)]
    return sorted(names, key=lambda n: int(_NAME.match(n).group(1)))  # type: ignore[union-attr]


def save(store: Store, step: int, payload: dict[str, Any], *, keep: int) -> str:
    """Publish payload as ckpt-STEP.pt atomically, then drop all but the newest `keep`; returns its URL."""
    name = checkpoint_name(step)
    with store.open_atomic(name) as f:
        torch.save({"format_version": FORMAT_VERSION, **payload}, f)
    try:
        for old in list_checkpoints(store)[:-keep]:
            store.remove(old)
    except (ShardifyError, OSError):
        pass  # the new checkpoint is stored; the next save prunes what this one could not
    return store.url_of(name)


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
    """Read a checkpoint onto the CPU; refuses other format versions."""
    data = store.read(name)
    try:
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not our checkpoint"
        raise CheckpointUnreadable(f"{store.url_of(name)} is not a readable trainer checkpoint ({exc})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise CheckpointMismatch(f"{store.url_of(name)}: checkpoint format {ckpt.get('format_version')!r}, "
                                 f"this trainer reads {FORMAT_VERSION}; use --resume none")
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


def check_identity(ckpt: dict[str, Any], identity: dict[str, Any], *, where: str) -> None:
    """Refuse a checkpoint of another model, class count or dataset, saying which and what to do."""
    saved = ckpt.get("identity", {})
    for key, value in identity.items():
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
