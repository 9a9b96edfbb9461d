"""What a loader is asked for: LoaderConfig, every option of make_loader but the URL, validated once.

A leaf of the loader package: start-up, state, worker and ShardLoader all read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataio.decode.images import DEFAULT_MAX_PIXELS
from dataio.format.manifest import Manifest
from dataio.plan.tokens import PACKINGS
from dataio.storage.store import StorageOptions

DECODES = ("cpu", "dali", "gpu", "auto", None)
TAILS = ("drop", "pad")
ON_CORRUPT = ("raise", "skip")
START_METHODS = (None, "fork", "spawn", "forkserver")
WORKER_MODES = ("auto", "threads", "processes")
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


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Every loader option and its default, the one place they are written: make_loader takes
    these besides the URL (and rank, world_size, num_workers, which build the Topology); batch_size
    is per rank."""

    batch_size: int
    seed: int = 0
    # "cpu": uint8 N3HW images; None: raw bytes; "dali": DALI in the main process; "gpu": raw batches decoded on
    # the rank's GPU in the main process; "auto": CPU workers and the GPU both decode on a CUDA device, else "cpu".
    decode: str | None = "cpu"
    image_size: int = 224
    train: bool = True  # random resized crop + flip; False: resize + centre crop
    max_pixels: int = DEFAULT_MAX_PIXELS
    tail: str = "drop"  # "pad": every sample once, repeats flagged False in batch["mask"]
    shuffle: bool = True
    shuffle_window: int = 4096
    # A worker holds a whole window in memory while prefetching the next (prefetch_bytes), so the
    # window is also capped at this many bytes of the dataset's mean sample (128 MiB: ~1200
    # ImageNet JPEGs of 100 KB, like webdataset's usual 1000-sample buffer); None: no cap.
    shuffle_window_bytes: int | None = 128 * MiB
    fields: tuple[str, ...] | None = None  # project samples to these fields (None: all)
    transform: Callable[..., Any] | None = None  # cpu: per image (3,H,W) uint8 tensor; else per sample dict
    collate: Callable[[list[dict[str, Any]]], Any] | None = None
    on_corrupt: str = "raise"
    # Read ahead of use, per worker process (one budget for all reader threads). None: by task
    # (read_ahead_bytes): RAW and tokens 128 MiB; decoding a few batches' bytes, since decode
    # consumes ~100-300 samples/s per worker and anything read further ahead only sits in memory.
    prefetch_bytes: int | None = None
    max_in_flight: int = 8
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None
    storage: StorageOptions | None = None
    verify_index: bool = True
    # Check every sample (tar) or column chunk (Parquet) read against the manifest's version-3
    # checksums: one xxh3 pass over bytes already in memory; older datasets load unverified, noted once.
    verify_checksums: bool = True
    # One listing of the prefix (single-file manifests), in the background from the first batch on:
    # a missing shard fails within the first batches, not when it is read; False: no listing.
    check_shards: bool = True
    pin_memory: bool = False
    multiprocessing_context: str | None = None
    prefetch_factor: int = 2  # batches ready per worker process (DataLoader's queue); reader threads: in all
    startup_timeout_s: float = 300.0  # how long ranks wait for each other to open the dataset
    dali_threads: int = 2
    # The epoch's samples (None: the sum of the sources' sizes); one dataset given another size is
    # resampled as a mixture of one (plan/mix.py).
    epoch_samples: int | None = None
    # RAW bytes and decoded images packed into reused slabs (dataio/stream/slabs.py): a batch's
    # PackedBytes and images stay valid until the caller asks for the next batch; False: tensors the
    # caller may keep.
    reuse_buffers: bool = False
    # DECODE: batches' read buffers and, in worker processes, their decoded images stay allocated
    # and are reused once nothing refers to them (stream/image_slots.py, slabs.StoragePool): no
    # lifetime rule, ~110 us of page faults less per sample, for the peak memory kept resident
    # (measured, 2 workers, batch 256, 224 px: peak PSS 476 -> 621 MiB). False: fresh memory per batch.
    pooled_buffers: bool = True
    # Who runs the num_workers plan workers: "threads" (reader threads in this process; decode=None or
    # "cpu"), "processes" (DataLoader workers), "auto": threads for decode=None on tar shards (one dataset
    # or a mixture of tar sources) without a transform/collate hook (loader/threads.py), processes
    # otherwise (decoding threads take the GIL from the training loop's own ops: docs/guides/loading.md).
    worker_mode: str = "auto"
    # Worker processes start when the loader is built (each reading its first window), not at the
    # first next(); with decode="cpu" (no transform/collate hook, no reuse_buffers) each iteration's
    # first batch is decoded in this process with num_workers threads while they start
    # (loader/first_batch.py). With num_workers=0 (RAW from local files) the first window is laid
    # out in a thread while the loader is built. The batches and their order are the same either
    # way; False: workers start at the first iteration and make every batch.
    early_start: bool = True
    # One label space for every source (loader/labels.py): "same" (names must agree by index),
    # "union" (merged by name, sorted), or a map {source: {name: index}} / {name: index}.
    label_space: str | Mapping[str, Any] = "same"
    # Token datasets (loader/tokens.py): batches of seq_len-token packed sequences (None: a dataset of
    # samples); packing "concat" or "aligned"; the dataset's tokenizer file, refused unless its hash matches
    # (image-text pairs, with context_length: the tokenizer of the captions).
    seq_len: int | None = None
    packing: str = "concat"
    tokenizer: str | None = None
    # A mixture's weights over the run (plan/schedule.py Pieces): make_loader(weights=Schedule); None: fixed.
    mix_schedule: tuple[Any, ...] | None = None
    # Image-text pairs (stream/captions.py): each batch's captions tokenized in the workers with
    # `tokenizer` into input_ids and attention_mask [B, context_length]; None: captions stay text.
    context_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "image_size", "shuffle_window", "max_in_flight",
                     "prefetch_factor", "max_pixels", "dali_threads"):
            check_int(name, getattr(self, name), minimum=1)
        if self.prefetch_bytes is not None:
            check_int("prefetch_bytes", self.prefetch_bytes, minimum=1)
        check_int("seed", self.seed, minimum=0)
        if self.seq_len is not None:
            check_int("seq_len", self.seq_len, minimum=1)
        check_choice("packing", self.packing, PACKINGS)
        check_choice("decode", self.decode, DECODES)
        check_choice("tail", self.tail, TAILS)
        check_choice("on_corrupt", self.on_corrupt, ON_CORRUPT)
        check_choice("multiprocessing_context", self.multiprocessing_context, START_METHODS)
        check_choice("worker_mode", self.worker_mode, WORKER_MODES)
        if self.worker_mode == "threads" and self.decode in ("dali", "auto"):
            raise ValueError(f"worker_mode='threads' is for decode=None or 'cpu' (or 'gpu'); decode={self.decode!r} "
                             "reads its bytes in worker processes (worker_mode='processes' or 'auto')")
        if isinstance(self.fields, str):
            raise TypeError(f"fields must be a sequence of names, not the string {self.fields!r}")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))
        for name in ("transform", "collate"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"{name} must be callable")
        if (self.cache_dir is None) != (self.cache_limit_bytes is None):
            raise ValueError("give cache_dir and cache_limit_bytes together (or neither: no disk cache)")
        if self.cache_limit_bytes is not None:
            check_int("cache_limit_bytes", self.cache_limit_bytes, minimum=1)
        if self.shuffle_window_bytes is not None:
            check_int("shuffle_window_bytes", self.shuffle_window_bytes, minimum=1)
        if self.storage is not None and not isinstance(self.storage, StorageOptions):
            raise TypeError("storage must be a dataio.StorageOptions")
        if self.epoch_samples is not None:
            check_int("epoch_samples", self.epoch_samples, minimum=0)
        if not self.startup_timeout_s > 0:
            raise ValueError("startup_timeout_s must be positive")
        if not isinstance(self.verify_checksums, bool):
            raise TypeError(f"verify_checksums must be True or False, got {self.verify_checksums!r}")
        if not isinstance(self.early_start, bool):
            raise TypeError(f"early_start must be True or False, got {self.early_start!r}")
        if not isinstance(self.pooled_buffers, bool):
            raise TypeError(f"pooled_buffers must be True or False, got {self.pooled_buffers!r}")
        if not isinstance(self.reuse_buffers, bool):
            raise TypeError(f"reuse_buffers must be True or False, got {self.reuse_buffers!r}")
        if self.reuse_buffers and self.decode in ("dali", "gpu", "auto"):
            raise ValueError(f"reuse_buffers=True is for decode=None or 'cpu'; decode={self.decode!r} holds batches ahead")
        check_label_space(self.label_space)
        if self.context_length is not None:  # image-text pairs
            check_int("context_length", self.context_length, minimum=2)
            if self.seq_len is not None or self.decode not in ("cpu", "dali"):
                raise ValueError("context_length tokenizes the captions of image-text pairs beside their decoded "
                                 "images: use it with decode='cpu' or 'dali', without seq_len (token datasets)")
        if self.decode in ("dali", "gpu") and (self.transform is not None or self.collate is not None):
            raise ValueError(f"decode={self.decode!r} decodes in the main process: transform/collate hooks need "
                             "decode='cpu' or None")


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


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
