"""Where samples come from: an image folder tree, a table (CSV, JSONL, Parquet) or existing tar shards.

A source is scanned once in the parent (`open_source`) into cheap, picklable references
(`Ref`: key, label, location, estimated size); worker processes then turn a shard's refs into
bytes with `Source.load`. No image bytes are read during the scan, so the assignment of samples
to shards is known before any worker starts and does not depend on the number of workers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from dataio.decode.images import IMAGE_EXTS
from dataio.errors import ShardifyError
from dataio.format.manifest import Field

TABLE_EXTS = (".csv", ".tsv", ".tab", ".jsonl", ".ndjson", ".parquet", ".pq")


class SourceError(ShardifyError):
    """The source of `shardify write` is missing, empty or not what the options say."""


class SampleLoadError(SourceError):
    """One sample of the source could not be loaded; `where` is its file, URL or table row."""

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True, slots=True)
class Ref:
    """One sample before loading: `loc` is a file path (folder), a row number (table) or tar members."""

    key: str
    label: int | None
    loc: Any
    size_bytes: int
    num_members: int = 2


@dataclass(slots=True)
class RawSample:
    """One loaded sample: image bytes and extension (or None), label, and other fields by name."""

    key: str
    label: int | None
    image_ext: str | None
    image: bytes | None
    extras: dict[str, Any]
    where: str
    origin: str = ""  # provenance: relative path in the source, "row N" of a table, a URL, or TAR#KEY


@dataclass(kw_only=True)
class Source:
    """A scanned source: refs in source order, label names, the fields samples will carry."""

    description: str
    refs: list[Ref]
    label_names: tuple[str, ...] | None
    image_exts: tuple[str, ...]
    extra_fields: tuple[Field, ...] = ()
    has_labels: bool = True

    def __getstate__(self) -> dict[str, Any]:
        # A worker gets its shard's refs separately: never pickle every ref (or a table) per task.
        state = dict(self.__dict__)
        state["refs"] = []
        if "_table" in state:
            state["_table"] = None
        return state

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        """Yield each ref with its sample, or the exception that loading it raised."""
        raise NotImplementedError


_EXT_ALIASES = {"jpeg": "jpg", "jpe": "jpg", "jfif": "jpg", "jif": "jpg", "tiff": "tif"}


def normalize_ext(ext: str) -> str:
    """Lower case, no dot, one name per format (`.JPEG`, `.jfif` -> `jpg`; `.tiff` -> `tif`)."""
    ext = ext.lower().lstrip(".")
    return _EXT_ALIASES.get(ext, ext)


IMAGE_EXT_SET = {normalize_ext(e) for e in IMAGE_EXTS}


KEY_MODES = ("index", "path")
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-/]+")


def path_keys(rels: Sequence[str]) -> list[str]:
    """WebDataset-style keys from relative paths: extension dropped, sanitised, unique, stable.

    `cat/img 1.v2.jpg` -> `cat/img_1_v2`: anything but letters, digits, `_`, `-` and `/` becomes
    `_` (WebDataset splits KEY.EXT at the first dot of the basename, tar names cannot hold
    whitespace); paths that collide after that get `_2`, `_3`... in the order given (sorted scans
    give the same keys on every re-run of the same source).
    """
    keys: list[str] = []
    seen: set[str] = set()
    for rel in rels:
        stem = rel.replace("\\", "/")
        base = stem.rsplit("/", 1)[-1]
        if "." in base:
            stem = stem[: len(stem) - len(base) + base.rindex(".")]
        key = _fit_tar_header(re.sub(r"/+", "/", _UNSAFE_KEY_CHARS.sub("_", stem)).strip("/") or "_", rel)
        unique, n = key, 1
        while unique in seen:
            n += 1
            unique = f"{key}_{n}"
        seen.add(unique)
        keys.append(unique)
    return keys


# A tar member name must fit ustar's header: up to 155 bytes of directories, then a name of up to
# 100 (KEY.EXT, plus a `_N` when keys collide); stock readers and DALI take nothing longer.
_MAX_KEY_DIR, _MAX_KEY_NAME = 150, 80


def _fit_tar_header(key: str, rel: str) -> str:
    """`key` as it is when short enough, else its long parts cut and ended by a hash of `rel` (stable)."""
    folder, _, name = key.rpartition("/")
    if len(folder) <= _MAX_KEY_DIR and len(name) <= _MAX_KEY_NAME:
        return key
    digest = f"{xxhash.xxh3_64_intdigest(rel.encode('utf-8', 'surrogateescape')):016x}"[:10]
    if len(name) > _MAX_KEY_NAME:
        name = f"{name[: _MAX_KEY_NAME - 11]}_{digest}"
    if len(folder) > _MAX_KEY_DIR:
        folder = f"{folder[: _MAX_KEY_DIR - 11].rstrip('/')}_{digest}"
    return f"{folder}/{name}" if folder else name


def key_width(n: int) -> int:
    return max(6, len(str(max(n - 1, 0))))


def extras_json(extras: dict[str, Any]) -> bytes:
    """Table values of one sample as the KEY.json member (bytes values travel as their own members)."""
    return json.dumps({k: v for k, v in extras.items() if not isinstance(v, bytes)}, default=str).encode()
