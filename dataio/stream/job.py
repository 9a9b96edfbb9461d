"""What one worker is given and opens: Ticket, WorkerJob, and OpenJob (the job opened in a process).

A leaf of the stream floor: the decoded stream, the RAW engine, the token stream, collate and the
DataLoader dataset all take an OpenJob, never the object that holds them. Which stream a job runs
(STREAM_KINDS) was decided once, by the loader's execution plan (loader/execution.py): the job
carries the decision, and nothing below re-decides it. The job is picklable (the `spawn`
start method works); an OpenJob opens the job's reader and decoder once per process, lazily, and
the plan of a worker slot is chosen here and nowhere else. A single dataset is a mixture of one
(plan/mix.py): one reader over the job's datasets (readers/mixed.py), one plan call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataio.decode.cpu import CpuDecoder, DecodeConfig
from dataio.format.manifest import Manifest
from dataio.plan.mix import MixState, Mixture, plan_mix_worker
from dataio.plan.plan import WorkerPlan
from dataio.plan.token_plan import TokenPlanConfig
from dataio.plan.types import PlanConfig, PlanState, Segment, Topology
from dataio.readers.by_format import make_reader
from dataio.readers.mixed import MixedReader, SourcePiece
from dataio.readers.token_shards import TokenShards, TokenSources
from dataio.storage.cache import DiskCache
from dataio.storage.store import Store


# What a worker's stream makes of its windows: RAW tar bytes without per-sample objects (raw.py),
# sample dicts decoded or not (decoded.py), the same read batch by batch from local files
# (by_sample.py), packed token sequences (token_stream.py).
STREAM_KINDS = ("raw", "decoded", "by_sample", "tokens")
DECODE_AT = ("none", "worker", "main")


@dataclass(frozen=True, slots=True)
class Ticket:
    """One unit of work the main process sends: batch `batch_index` of iteration `token`."""

    token: int
    plan_state: PlanState  # where the iteration starts
    batch_index: int  # rank-level batch number counted from that state's position
    released_below: int = 0  # batches of this iteration the caller has moved past (slabs.py)
    # Batches below `head` are made in the main process (loader/first_batch.py): a ticket for one
    # returns None at once, and its slot's stream skips them without reading or decoding them.
    head: int = 0
    # Only open the slot's stream from plan_state and read its first window (a bet the next
    # iteration starts there, as when the loader is built); returns None.
    warm: bool = False
    # decode="auto" (loader/hybrid.py): ship this batch undecoded; the main process decodes it on the GPU.
    raw: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class JobDataset:
    """One dataset a job reads: its store, its manifest, the reader's projection and its label field."""

    store: Store
    manifest: Manifest
    fields: tuple[str, ...] | None  # None: every field
    label_field: str


@dataclass(frozen=True, kw_only=True)
class TokenSpec:
    """What packing needs besides the plan: the sequence length and packing, what the plan cuts
    (per source, per shard: concat one entry, the shard's tokens; aligned every document's length),
    whether batches carry position_ids and doc_ids, and the padding token."""

    seq_len: int
    packing: str
    doc_lengths: tuple[tuple[np.ndarray, ...], ...]
    with_docs: bool = True
    pad_id: int = 0


@dataclass(frozen=True, kw_only=True)
class WorkerJob:
    """Everything a worker needs, picklable; built once in the main process."""

    datasets: tuple[JobDataset, ...]  # in mixture order; one dataset: a mixture of one
    mixture: Mixture  # global shard and sample numbers: the datasets' concatenated
    plan_config: PlanConfig  # batch_size (per rank) lives here
    topology: Topology
    verify_index: bool
    verify_checksums: bool
    # Where images are decoded (the execution plan's call): "none" (bytes), "worker" (here, on the
    # CPU), "main" (bytes, with each sample's id and the epoch, for a decoder in the main process).
    decode_at: str
    decode_config: DecodeConfig | None
    image_fields: tuple[str, ...]  # a sample's image: the first of these it has (IMAGE_FIELD_ORDER)
    transform: Callable[..., Any] | None
    collate: Callable[[list[dict[str, Any]]], Any] | None
    on_corrupt: str
    prefetch_bytes: int
    max_in_flight: int
    cache_dir: str | None
    cache_limit_bytes: int | None
    slice_bytes: int | None = None  # Parquet row groups bigger than this (the window budget) are read in slices
    reuse_buffers: bool = False  # pack raw bytes into this process's SlabRing (slabs.py)
    # Decoded images on the worker's pooled shared storages, which the main process releases
    # (image_slots.py): only where it sees the batch's own image tensor (no collate hook, no pinning).
    pooled_images: bool = False
    pooled_reads: bool = True  # batch-by-batch reads (tokens: chunks made in process) into StoragePool buffers
    stream: str = "decoded"  # one of STREAM_KINDS, decided by the execution plan
    tokens: TokenSpec | None = None  # stream "tokens": packing's own settings
    captions: Any = None  # image-text pairs: the caption stage (stream/captions.py CaptionStage), or None

    def __post_init__(self) -> None:
        assert self.stream in STREAM_KINDS and (self.stream == "tokens") == (self.tokens is not None)
        assert self.decode_at in DECODE_AT

    @property
    def token_config(self) -> TokenPlanConfig:
        """The token plan's settings (stream "tokens"): the sequence cut and the plan's."""
        assert self.tokens is not None
        return TokenPlanConfig(seq_len=self.tokens.seq_len, packing=self.tokens.packing, plan=self.plan_config)

    @property
    def batch_size(self) -> int:
        return self.plan_config.batch_size

    @property
    def manifest(self) -> Manifest:
        """The first dataset's manifest: its field kinds and label field name the batch's."""
        return self.datasets[0].manifest

    @property
    def fields(self) -> tuple[str, ...] | None:
        return self.datasets[0].fields

    @property
    def mixes(self) -> bool:
        """Whether batches say which source each sample came from (a real mixture, not one dataset)."""
        return not self.mixture.single

    def plan(self, worker_id: int, state: PlanState) -> WorkerPlan:
        """Worker `worker_id`'s windows from `state` to the epoch's end: the one plan choice."""
        slot = self.topology.slot(worker_id)
        return plan_mix_worker(self.mixture, config=self.plan_config, slot=slot,
                               state=MixState(plan=state, mixture=self.mixture.describe()))

    def window_bytes(self) -> int:
        """A full shuffle window of the datasets' mean-sized samples; windows may start smaller."""
        manifests = [d.manifest for d in self.datasets]
        mean = sum(m.num_bytes for m in manifests) / max(1, sum(m.num_samples for m in manifests))
        return max(1, int(self.plan_config.shuffle_window * mean))


class OpenJob:
    """A WorkerJob opened in this process: one reader over its datasets and a decoder, each made
    on first use (so forked or spawned workers open their own storage clients)."""

    def __init__(self, job: WorkerJob, *, decode_threads: int = 1) -> None:
        self.job = job
        self.decode_threads = decode_threads  # threads decoding one batch (loader/first_batch.py: the main process's)
        self._reader: MixedReader | None = None
        self._tokens: TokenSources | None = None
        self._decoder: CpuDecoder | None = None
        self.ship_raw = False  # the batch being made goes out undecoded (Ticket.raw)

    @property
    def reader(self) -> MixedReader:
        """Global segments in, samples with global ids out; each piece read by its dataset's reader."""
        if self._reader is None:
            job = self.job
            cache = self._cache()
            readers = [
                make_reader(Store(d.store.raw_url, d.store.options, d.store.retry), d.manifest, fields=d.fields,
                            verify_index=job.verify_index, cache=cache, slice_bytes=job.slice_bytes,
                            verify_checksums=job.verify_checksums)
                for d in job.datasets
            ]
            self._reader = MixedReader(readers, [d.manifest for d in job.datasets],
                                       label_fields=[d.label_field for d in job.datasets])
        return self._reader

    @property
    def token_reader(self) -> TokenSources:
        """The token sources' shards (stream "tokens"), read by windows; one per process."""
        if self._tokens is None:
            job = self.job
            cache = self._cache()
            self._tokens = TokenSources([TokenShards(Store(d.store.raw_url, d.store.options, d.store.retry),
                                                     d.manifest, verify_checksums=job.verify_checksums, cache=cache)
                                         for d in job.datasets])
        return self._tokens

    def _cache(self) -> DiskCache | None:
        job = self.job
        return None if job.cache_dir is None else DiskCache(job.cache_dir, limit_bytes=job.cache_limit_bytes)

    def split(self, seg: Segment) -> list[SourcePiece]:
        """A window's segment as the pieces the reader fetches."""
        return self.reader.split_segment(seg)

    @property
    def decoder(self) -> CpuDecoder:
        if self._decoder is None:
            self._decoder = CpuDecoder(self.job.decode_config, transform=self.job.transform,
                                       num_threads=self.decode_threads)
        return self._decoder

    def url_of_shard(self, shard: int) -> str:
        """The redacted URL of a global shard."""
        reader = self.reader
        s = int(np.searchsorted(self.job.mixture.shard_base, shard, side="right")) - 1
        return reader.readers[s].store.url_of(reader.manifests[s].shard_paths[shard - reader.shard_base[s]])
