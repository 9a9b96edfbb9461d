"""What a loader is asked for: LoaderConfig, every option of make_loader but the URL, validated once,
grouped by concern (reading, workers, images, tokens, mixing) and read flat by name as well.

A leaf of the loader package: start-up, state, the execution plan and ShardLoader all read it.
`LoaderConfig.from_options(**flat)` builds one from make_loader's flat keywords, and
`LoaderConfig.options()` lists every option flat (name, default, type, help) for a CLI.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataio.decode.images import DEFAULT_MAX_PIXELS
from dataio.format.manifest import Manifest
from dataio.plan.token_plan import PACKINGS
from dataio.storage.store import StorageOptions

# "cpu": in the workers; "dali", "gpu": in the main process over undecoded batches; "auto": the GPU
# decoder beside CPU workers where a CUDA device is, else "cpu" (loader/execution.py decides).
DECODES = ("cpu", "dali", "gpu", "auto", None)
TAILS = ("drop", "pad")
ON_CORRUPT = ("raise", "skip")
START_METHODS = (None, "fork", "spawn", "forkserver")
WORKER_MODES = ("auto", "threads", "processes")
MIX_KINDS = ("by_batch", "in_batch")
LABEL_SPACES = ("same", "union")  # or a mapping: see dataio/loader/labels.py
MiB = 1 << 20
RAW_PREFETCH_BYTES = 128 * MiB  # RAW (and token) read-ahead: a window or more, measured fastest
# Decoding reads ahead this many batches (the one being decoded counts): decode is ~100x slower than
# reading, so more only sits in memory; the floor keeps several requests in flight on object storage.
DECODE_PREFETCH_BATCHES = 2
DECODE_PREFETCH_FLOOR_BYTES = 16 * MiB


@dataclass(frozen=True, slots=True)
class Source:
    """One dataset of a mixture: its URL and a weight (its share of what repeat sources leave;
    default 1) or a repeat factor (repeat x its size samples per epoch: 2.0 twice, 0.5 half)."""

    url: str
    weight: float | None = None
    repeat: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise TypeError(f"Source.url must be a non-empty string, got {self.url!r}")
        if self.weight is not None and self.repeat is not None:
            raise ValueError(f"Source({self.url!r}): give a weight or a repeat, not both")
        for name in ("weight", "repeat"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value < float("inf")):
                raise ValueError(f"Source({self.url!r}): {name} must be a finite number >= 0, got {value!r}")


def _opt(default: Any, help: str, **kw: Any) -> Any:
    """A config field with its one-line help (the flat view's, and each trainer flag's)."""
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True, kw_only=True)
class ReadingConfig:
    """Reading and storage: read-ahead, caches, checks of what is read, the storage's options."""

    # Read ahead of use, per worker process (one budget for all reader threads). None: by task
    # (read_ahead_bytes): RAW and tokens 128 MiB; decoding a few batches' bytes, since decode
    # consumes ~100-300 samples/s per worker and anything read further ahead only sits in memory.
    prefetch_bytes: int | None = _opt(None, "read-ahead per worker process, bytes (None: 128 MiB raw/tokens, "
                                            "a few batches when decoding)")
    max_in_flight: int = _opt(8, "ranged reads in flight per worker process")
    cache_dir: str | None = _opt(None, "a local disk cache of what object storage returns (with cache_limit_bytes)")
    cache_limit_bytes: int | None = _opt(None, "the disk cache's size limit, bytes (with cache_dir)")
    storage: StorageOptions | None = _opt(None, "credentials, endpoint, retries of the store (dataio.StorageOptions)")
    verify_index: bool = _opt(True, "check each tar index against its shard")
    # Check every sample (tar) or column chunk (Parquet) read against the manifest's version-3
    # checksums: one xxh3 pass over bytes already in memory; older datasets load unverified, noted once.
    verify_checksums: bool = _opt(True, "check every sample or column chunk read against its checksum")
    # One listing of the prefix (single-file manifests), in the background from the first batch on:
    # a missing shard fails within the first batches, not when it is read; False: no listing.
    check_shards: bool = _opt(True, "list the dataset beside the first batches: a missing shard fails early")
    startup_timeout_s: float = _opt(300.0, "how long ranks wait for each other to open the dataset, seconds")

    def __post_init__(self) -> None:
        check_int("max_in_flight", self.max_in_flight, minimum=1)
        if self.prefetch_bytes is not None:
            check_int("prefetch_bytes", self.prefetch_bytes, minimum=1)
        if (self.cache_dir is None) != (self.cache_limit_bytes is None):
            raise ValueError("give cache_dir and cache_limit_bytes together (or neither: no disk cache)")
        if self.cache_limit_bytes is not None:
            check_int("cache_limit_bytes", self.cache_limit_bytes, minimum=1)
        if self.storage is not None and not isinstance(self.storage, StorageOptions):
            raise TypeError("storage must be a dataio.StorageOptions")
        if not self.startup_timeout_s > 0:
            raise ValueError("startup_timeout_s must be positive")
        check_bool("verify_checksums", self.verify_checksums)


@dataclass(frozen=True, kw_only=True)
class WorkersConfig:
    """Who reads and how batches reach the caller: worker mode, start, queues, buffers, pinning."""

    # Who runs the num_workers plan workers: "threads" (reader threads in this process; decode=None or
    # "cpu"), "processes" (DataLoader workers), "auto": the execution plan's choice (loader/execution.py):
    # threads for RAW tar, processes for decoding (its threads take the GIL from the training loop:
    # docs/guides/loading.md), the caller's thread for token datasets.
    worker_mode: str = _opt("auto", "who runs the plan workers: auto, threads or processes")
    pin_memory: bool = _opt(False, "pin each batch's tensors (for a fast copy to the GPU)")
    multiprocessing_context: str | None = _opt(None, "start method of worker processes: fork, spawn, forkserver")
    prefetch_factor: int = _opt(2, "batches ready per worker process (reader threads: in all)")
    # Worker processes start when the loader is built (each reading its first window), not at the
    # first next(); with decode="cpu" (no transform/collate hook, no reuse_buffers) each iteration's
    # first batch is decoded in this process with num_workers threads while they start
    # (loader/first_batch.py). With num_workers=0 (RAW from local files) the first window is laid
    # out in a thread while the loader is built. The batches and their order are the same either way.
    early_start: bool = _opt(True, "start the workers (and the first batch) when the loader is built")
    # RAW bytes and decoded images packed into reused slabs (dataio/stream/slabs.py): a batch's
    # PackedBytes and images stay valid until the caller asks for the next batch; False: tensors the
    # caller may keep.
    reuse_buffers: bool = _opt(False, "batches as views of reused slabs, valid until the next batch")
    # DECODE: batches' read buffers and, in worker processes, their decoded images stay allocated
    # and are reused once nothing refers to them (stream/image_slots.py, slabs.StoragePool): no
    # lifetime rule, ~110 us of page faults less per sample, for the peak memory kept resident
    # (measured, 2 workers, batch 256, 224 px: peak PSS 476 -> 621 MiB). False: fresh memory per batch.
    pooled_buffers: bool = _opt(True, "reuse read buffers and decoded-image storages once nothing refers to them")

    def __post_init__(self) -> None:
        check_int("prefetch_factor", self.prefetch_factor, minimum=1)
        check_choice("multiprocessing_context", self.multiprocessing_context, START_METHODS)
        check_choice("worker_mode", self.worker_mode, WORKER_MODES)
        for name in ("early_start", "pooled_buffers", "reuse_buffers"):
            check_bool(name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class ImagesConfig:
    """Samples and their images: decoding, size and crop, hooks, corrupt samples."""

    decode: str | None = _opt("cpu", "where images are decoded: cpu, dali, gpu, auto, or None for raw bytes")
    image_size: int = _opt(224, "decoded images' side, pixels")
    train: bool = _opt(True, "random resized crop + flip; False: resize + centre crop")
    max_pixels: int = _opt(DEFAULT_MAX_PIXELS, "refuse images larger than this many pixels")
    transform: Callable[..., Any] | None = _opt(None, "cpu: per image (3,H,W) uint8 tensor; else per sample dict")
    collate: Callable[[list[dict[str, Any]]], Any] | None = _opt(None, "build each batch from its samples")
    on_corrupt: str = _opt("raise", "a corrupt sample: raise, or skip (replaced, counted in the stats)")
    dali_threads: int = _opt(2, "DALI's CPU threads (decode='dali')")

    def __post_init__(self) -> None:
        for name in ("image_size", "max_pixels", "dali_threads"):
            check_int(name, getattr(self, name), minimum=1)
        check_choice("decode", self.decode, DECODES)
        check_choice("on_corrupt", self.on_corrupt, ON_CORRUPT)
        for name in ("transform", "collate"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"{name} must be callable")
        if self.decode in ("dali", "gpu") and (self.transform is not None or self.collate is not None):
            raise ValueError(f"decode={self.decode!r} decodes in the main process: transform/collate hooks need "
                             "decode='cpu' or None")


@dataclass(frozen=True, kw_only=True)
class TokensConfig:
    """Token datasets (loader/token_data.py): batches of seq_len-token packed sequences."""

    seq_len: int | None = _opt(None, "tokens per sequence: read a token dataset (None: a dataset of samples)")
    packing: str = _opt("concat", "concat (documents run on) or aligned (each sequence starts a document)")
    tokenizer: str | None = _opt(None, "the dataset's tokenizer file, refused unless its hash matches "
                                       "(image-text pairs: the captions' tokenizer)")
    # Image-text pairs (stream/captions.py): each batch's captions tokenized in the workers with
    # `tokenizer` into input_ids and attention_mask [B, context_length]; None: captions stay text.
    context_length: int | None = _opt(None, "image-text pairs: tokens per caption (None: captions stay text)")

    def __post_init__(self) -> None:
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len, minimum=1)
        check_choice("packing", self.packing, PACKINGS)
        if self.context_length is not None:
            check_int("context_length", self.context_length, minimum=2)


@dataclass(frozen=True, kw_only=True)
class MixingConfig:
    """Several datasets in one epoch: its size, one label space, weights over the run."""

    # The epoch's samples (None: the sum of the sources' sizes); one dataset given another size is
    # resampled as a mixture of one (plan/mix.py).
    epoch_samples: int | None = _opt(None, "samples per epoch (None: the sources' sizes summed)")
    # One label space for every source (loader/labels.py): "same" (names must agree by index),
    # "union" (merged by name, sorted), or a map {source: {name: index}} / {name: index}.
    label_space: str | Mapping[str, Any] = _opt("same", "the sources' labels: same, union, or a map")
    # A mixture's weights over the run (plan/schedule.py Pieces): make_loader(weights=Schedule); None: fixed.
    mix_schedule: tuple[Any, ...] | None = _opt(None, "weights that change over the run (plan/schedule.py pieces)")
    # Sources of different kinds (samples, image-text pairs, tokens: plan/kinds.py) cannot share a batch:
    # "by_batch" gives each batch one kind (batch["kind"]); "in_batch" refuses such a mixture.
    mix_kinds: str = _opt("by_batch", "sources of different kinds: by_batch (each batch one kind), or in_batch (refused)")

    def __post_init__(self) -> None:
        if self.epoch_samples is not None:
            check_int("epoch_samples", self.epoch_samples, minimum=0)
        check_choice("mix_kinds", self.mix_kinds, MIX_KINDS)
        check_label_space(self.label_space)


GROUPS: dict[str, type] = {"reading": ReadingConfig, "workers": WorkersConfig, "images": ImagesConfig,
                           "tokens": TokensConfig, "mixing": MixingConfig}


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Every loader option and its default, the one place they are written, grouped by concern: the
    plan's own (batch size per rank, seed, tail, shuffle, fields) here, and one frozen sub-config per
    concern (reading, workers, images, tokens, mixing). make_loader takes them flat, by name (and rank,
    world_size, num_workers, which build the Topology): `from_options(**flat)`; `options()` lists them,
    and `config.decode` reads `config.images.decode`."""

    batch_size: int = field(metadata={"help": "samples (or sequences) per batch, per rank"})
    seed: int = _opt(0, "the shuffle's and augmentation's seed")
    tail: str = _opt("drop", "the epoch's last partial global batch: drop, or pad (repeats flagged in batch['mask'])")
    shuffle: bool = _opt(True, "shuffle shards and, within windows, samples")
    shuffle_window: int = _opt(4096, "samples shuffled together")
    # A worker holds a whole window in memory while prefetching the next (prefetch_bytes), so the
    # window is also capped at this many bytes of the dataset's mean sample (128 MiB: ~1200
    # ImageNet JPEGs of 100 KB, like webdataset's usual 1000-sample buffer); None: no cap.
    shuffle_window_bytes: int | None = _opt(128 * MiB, "cap on a window's bytes of mean-sized samples (None: none)")
    fields: tuple[str, ...] | None = _opt(None, "project samples to these fields (None: all)")
    reading: ReadingConfig = field(default_factory=ReadingConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    images: ImagesConfig = field(default_factory=ImagesConfig)
    tokens: TokensConfig = field(default_factory=TokensConfig)
    mixing: MixingConfig = field(default_factory=MixingConfig)

    def __post_init__(self) -> None:
        for name in ("batch_size", "shuffle_window"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("seed", self.seed, minimum=0)
        check_choice("tail", self.tail, TAILS)
        if self.shuffle_window_bytes is not None:
            check_int("shuffle_window_bytes", self.shuffle_window_bytes, minimum=1)
        if isinstance(self.fields, str):
            raise TypeError(f"fields must be a sequence of names, not the string {self.fields!r}")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))
        for name, kind in GROUPS.items():
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"LoaderConfig.{name} must be a {kind.__name__}")
        decode = self.images.decode
        if self.workers.worker_mode == "threads" and decode in ("dali", "auto"):
            raise ValueError(f"worker_mode='threads' is for decode=None or 'cpu' (or 'gpu'); decode={decode!r} "
                             "reads its bytes in worker processes (worker_mode='processes' or 'auto')")
        if self.workers.reuse_buffers and decode in ("dali", "gpu", "auto"):
            raise ValueError(f"reuse_buffers=True is for decode=None or 'cpu'; decode={decode!r} holds batches ahead")

    def __getattr__(self, name: str) -> Any:
        """The flat view: `config.decode` is `config.images.decode` (every option by its flat name)."""
        group = _GROUP_OF.get(name)
        if group is None:
            raise AttributeError(f"LoaderConfig has no option {name!r}")
        return getattr(object.__getattribute__(self, group), name)

    @classmethod
    def from_options(cls, **flat: Any) -> LoaderConfig:
        """A LoaderConfig from flat options (make_loader's keywords): each into its group; TypeError for an
        unknown name, naming the closest."""
        groups: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        top: dict[str, Any] = {}
        for name, value in flat.items():
            if name not in _GROUP_OF:
                close = difflib.get_close_matches(name, list(_GROUP_OF), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else "; LoaderConfig.options() lists every option"
                raise TypeError(f"unknown loader option {name!r}{hint}")
            (groups[_GROUP_OF[name]] if _GROUP_OF[name] else top)[name] = value
        return cls(**top, **{name: GROUPS[name](**values) for name, values in groups.items()})

    @staticmethod
    def options() -> tuple[Option, ...]:
        """Every option, flat: name, default (dataclasses.MISSING: required), type and one line of help,
        in a stable order (the plan's own, then reading, workers, images, tokens, mixing)."""
        return OPTIONS


@dataclass(frozen=True, slots=True)
class Option:
    """One loader option in the flat view (make_loader's keyword, a trainer's flag)."""

    name: str
    default: Any  # dataclasses.MISSING: required
    type: Any  # the resolved annotation (int, int | None, ...)
    help: str
    group: str  # "" (the plan's own) or the sub-config holding it: reading, workers, images, tokens, mixing


def _flat_view() -> tuple[Option, ...]:
    out = []
    for group, kind in (("", LoaderConfig), *GROUPS.items()):
        hints = typing.get_type_hints(kind)
        out += [Option(name=f.name, default=f.default, type=hints[f.name], help=f.metadata["help"], group=group)
                for f in dataclasses.fields(kind) if f.name not in GROUPS]
    return tuple(out)


OPTIONS = _flat_view()
_GROUP_OF = {o.name: o.group for o in OPTIONS}


def window_samples(manifest: Manifest, config: LoaderConfig) -> int:
    """The shuffle window in samples: shuffle_window, lowered so a window of the dataset's mean-sized
    samples fits in shuffle_window_bytes. A function of the manifest: the same on every rank."""
    total_samples = manifest.num_samples
    if config.shuffle_window_bytes is None or total_samples == 0:
        return config.shuffle_window
    mean_bytes = max(1.0, manifest.num_bytes / total_samples)
    return max(1, min(config.shuffle_window, int(config.shuffle_window_bytes // mean_bytes)))


def read_ahead_bytes(config: LoaderConfig, *, decoding: bool, mean_sample_bytes: float = 0.0) -> int:
    """The read-ahead budget per worker process: prefetch_bytes when given; else RAW_PREFETCH_BYTES
    without decoding, and DECODE_PREFETCH_BATCHES batches of `mean_sample_bytes` with decoding (at
    least DECODE_PREFETCH_FLOOR_BYTES, which keeps max_in_flight reads going; at most the RAW budget)."""
    if config.prefetch_bytes is not None:
        return config.prefetch_bytes
    if not decoding:
        return RAW_PREFETCH_BYTES
    batches = int(DECODE_PREFETCH_BATCHES * config.batch_size * max(0.0, mean_sample_bytes))
    return min(RAW_PREFETCH_BYTES, max(DECODE_PREFETCH_FLOOR_BYTES, batches))


def mean_sample_bytes(manifests: Sequence[Manifest]) -> float:
    """The datasets' mean sample size in bytes (0.0 when they hold none)."""
    return sum(m.num_bytes for m in manifests) / max(1, sum(m.num_samples for m in manifests))


def check_label_space(value: Any) -> None:
    """ValueError unless `value` is one of LABEL_SPACES or a mapping (matched to the sources when opened)."""
    if isinstance(value, Mapping):
        return
    if value not in LABEL_SPACES:
        raise ValueError(f"label_space must be one of {list(LABEL_SPACES)}, a mapping {{source: {{name: index}}}} "
                         f"or {{name: index}}, got {value!r}")


def check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
