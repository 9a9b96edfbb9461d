"""The settings of one `shardify write` and the shapes passed between the parent and its workers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dataio.decode import images
from dataio.format.manifest import Field
from dataio.format.manifest_parts import PARTS_THRESHOLD
from dataio.storage.store import Store
from sharding.sources.base import Ref, Source


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenOptions:
    """How `shardify write --tokenizer` tokenizes documents (sharding/write/token_writer.py)."""

    tokenizer: str  # a tokenizer.json, or a NAME.tiktoken file
    tokenizer_hash: str  # "xxh3_64:<hex>" of that file: part of the resume fingerprint
    eos_token: str | None = None  # None: the tokenizer's own (sharding/write/tokenizer.py EOS_CANDIDATES)
    min_tokens: int = 0  # documents with fewer tokens (EOS not counted) are dropped and counted
    max_tokens: int | None = None  # documents with more are dropped and counted
    block_tokens: int = 1 << 16  # the checksum block (dataio/format/token_layout.py)

    def __post_init__(self) -> None:
        if self.min_tokens < 0:
            raise ValueError("--min-tokens must be >= 0")
        if self.max_tokens is not None and self.max_tokens < max(self.min_tokens, 1):
            raise ValueError("--max-tokens must be at least 1 and at least --min-tokens")
        if self.block_tokens < 1:
            raise ValueError("the checksum block must hold at least one token")


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteConfig:
    """How `shardify write` lays samples out; validated on construction."""

    format: str = "tar"
    shard_size_bytes: int = 256 * 1000**2
    max_samples_per_shard: int | None = None
    shuffle: bool = False
    seed: int = 0
    num_workers: int = 1
    max_side: int | None = None
    max_pixels: int = images.DEFAULT_MAX_PIXELS
    validate: str = "structure"
    on_error: str = "fail"
    overwrite: bool = False
    num_prefixes: int | None = None  # hashed directories under shards/; None: chosen from the shard count
    parts_threshold: int = PARTS_THRESHOLD  # more shards than this: a JSON root + Parquet parts
    engine: str = "local"  # "local": worker processes here; "ray": Ray tasks (sharding/write/engine_ray.py)
    ray_address: str | None = None  # engine "ray": an existing cluster; None starts a local Ray
    journal_every_s: float = 2.0  # the journal records confirmed shards this often: what --resume keeps
    tokens: TokenOptions | None = None  # format "tokens": text tokenized into token shards

    def __post_init__(self) -> None:
        if self.format not in ("tar", "parquet", "tokens"):
            raise ValueError(f"format {self.format!r}: choose tar or parquet")
        if (self.format == "tokens") != (self.tokens is not None):
            raise ValueError("format tokens goes with token options (a tokenizer), and only it")
        if self.shard_size_bytes < 1:
            raise ValueError("shard size must be at least 1 byte")
        if self.max_samples_per_shard is not None and self.max_samples_per_shard < 1:
            raise ValueError("max samples per shard must be at least 1")
        if self.num_prefixes is not None and not 1 <= self.num_prefixes <= 65536:
            raise ValueError("prefixes must be between 1 and 65536")
        if self.engine not in ("local", "ray"):
            raise ValueError(f"engine {self.engine!r}: choose local or ray")
        if self.ray_address is not None and self.engine != "ray":
            raise ValueError("a Ray address needs --engine ray")
        if self.parts_threshold < 0:
            raise ValueError("the manifest parts threshold must be >= 0")
        if self.num_workers < 1:
            raise ValueError("workers must be at least 1")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError("max side must be a positive number of pixels")
        if self.max_pixels < 1:
            raise ValueError("max pixels must be positive")
        if self.validate not in ("structure", "full", "header"):
            raise ValueError(f"validate {self.validate!r}: choose structure (walk each file to its end "
                             "marker), full (decode every pixel) or header")
        if not 0 < self.journal_every_s <= 3600:
            raise ValueError("the journal interval must be above 0 and at most 3600 seconds")
        if self.on_error not in ("fail", "skip"):
            raise ValueError(f"on_error {self.on_error!r}: choose fail or skip")


# Advice, in a sample's error, to use a write option: dropped where the write used it already.
_ADVICE_OF_OPTION = {
    ("on_error", "skip"): re.compile(r",? or (?:re)?(?:write|run) with --on-error skip(?: to leave such samples out)?"
                                     r"|\s*\(shardify write --on-error skip leaves such files out\)"),
}


def without_used_advice(text: str, options: Mapping[str, Any]) -> str:
    """`text` (a skipped sample's reason) without advice to use an option the write used already
    (`options`: a journal's write options): "re-export it or write with --on-error skip" -> "re-export it"."""
    for (name, value), advice in _ADVICE_OF_OPTION.items():
        if options.get(name) == value:
            text = advice.sub("", text)
    return text


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """What every shard of one dataset holds (the Parquet schema and the manifest's fields)."""

    image_exts: tuple[str, ...]
    has_labels: bool
    extra_fields: tuple[Field, ...]

    def fields(self, fmt: str) -> tuple[Field, ...]:
        out = [Field(name=e, type="image") for e in self.image_exts]
        if self.has_labels:
            out.append(Field(name="cls", type="int"))
        if fmt == "parquet":
            return (*out, *self.extra_fields)
        out += [f for f in self.extra_fields if f.type in ("bytes", "npy") or f.name == "json"]
        if any(f.type not in ("bytes", "npy") and f.name != "json" for f in self.extra_fields):
            out.append(Field(name="json", type="json"))
        return tuple(out)


def layout_of(source: Source, config: WriteConfig) -> Layout:
    exts = set(source.image_exts)
    if config.max_side is not None and exts - {"jpg"}:
        exts.add("png")  # downscale re-encodes everything but JPEG as PNG
    return Layout(image_exts=tuple(sorted(exts)), has_labels=source.has_labels, extra_fields=source.extra_fields)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardResult:
    """What one worker wrote: a manifest row plus the samples it skipped."""

    index: int
    path: str
    num_samples: int
    num_bytes: int
    checksum: str
    index_path: str | None = None
    index_bytes: int | None = None
    index_checksum: str | None = None
    row_groups: tuple[int, ...] | None = None
    sums_checksum: str | None = None  # tar: its per-sample checksums sidecar's checksum
    row_group_checksums: tuple[str, ...] | None = None  # parquet: per row group, its column chunks'
    skipped: tuple[dict[str, str], ...] = ()
    num_tokens: int | None = None  # tokens: the shard's tokens (EOS included)
    dropped: tuple[tuple[str, int], ...] = ()  # tokens: documents left out by reason (too_short, too_long)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardTask:
    """One shard to write: its number in the dataset, its path below DEST, its samples in write order."""

    index: int
    path: str
    refs: tuple[Ref, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class WriteJob:
    """What every shard of one write shares: samples from `source` into `dest`, laid out by `config`
    and `layout`. Sent once to each worker process or Ray task (a Store drops its client when pickled)."""

    source: Source
    dest: Store
    config: WriteConfig
    layout: Layout


class ProgressSink(Protocol):
    """Where a write reports: samples and bytes as they are written, and each finished shard."""

    def update(self, num_samples: int, num_bytes: int) -> None: ...

    def log_shard(self, result: ShardResult) -> None: ...
