"""How a loader makes its batches, decided once when it is built: ExecutionPlan, and the WorkerJob it
hands its readers.

From the config, the opened data (its kind and formats, where it lies) and the machine (a CUDA device
or not), one frozen object says
  - who reads: "caller" (in this process, in the caller's thread; with several plan workers their streams interleave
    there), "threads" (reader threads in this process, loader/threads.py) or "processes" (DataLoader
    worker processes);
  - the stream kind each plan worker runs (stream/job.py STREAM_KINDS): "raw", "decoded", "by_sample"
    or "tokens";
  - where images are decoded: "none" (bytes), "cpu" (in the workers), "dali", "gpu" or "cpu+gpu" (in
    this process over the workers' undecoded batches, dataio/decode/dali.py and the GPU decoder);
  - the first batch: made here while worker processes start ("main"), laid out in a thread while the
    loader is built ("laid out ahead", RAW from local files in this process), or by the readers;
  - buffer pooling: pooled read buffers, pooled image storages this process releases, worker slabs
    this process keeps mapped.
Nothing below re-decides: the loader, the first batch and the reader threads read this plan, and the
workers read the WorkerJob built from it (its `stream` and `decode_at`). `describe()` says it in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataio.decode.cpu import DecodeConfig
from dataio.loader.config import LoaderConfig, mean_sample_bytes, read_ahead_bytes
from dataio.loader.opened import OpenedData
from dataio.plan.types import Topology
from dataio.stream.captions import caption_stage
from dataio.stream.job import JobDataset, WorkerJob

READERS = ("caller", "threads", "processes")
DECODE_PLACES = ("none", "cpu", "dali", "gpu", "cpu+gpu")
FIRST_BATCH = ("main", "laid out ahead", "readers")


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionPlan:
    """What runs where for one loader; made once by `plan_execution`."""

    readers: str  # one of READERS
    num_readers: int  # reader threads or worker processes (0: in process)
    stream: str  # one of stream/job.py STREAM_KINDS
    decode: str  # one of DECODE_PLACES
    first_batch: str  # one of FIRST_BATCH
    early_start: bool  # worker processes start (each reading its first window) when the loader is built
    pooled_reads: bool  # by_sample: each batch's reads into reused buffers (slabs.StoragePool); tokens: the
    # chunks of batches made in this process (never in worker processes: their batches leave through shared memory)
    pooled_images: bool  # worker processes decode into pooled storages this process releases
    keep_slabs: bool  # reuse_buffers with worker processes: their slabs stay mapped here while held
    reuse_buffers: bool  # batches are views of reused slabs, valid until the next batch is asked for

    @property
    def decodes_in_main(self) -> bool:
        """Whether a decoder in this process maps the readers' undecoded batches (DALI, the GPU)."""
        return self.decode in ("dali", "gpu", "cpu+gpu")

    @property
    def hybrid(self) -> bool:
        """decode="auto" on a CUDA device: CPU workers and the GPU feed both make batches (hybrid.py)."""
        return self.decode == "cpu+gpu"

    def describe(self) -> str:
        """One line, e.g. 'readers=processes x2, stream=decoded, first batch in main, pooled buffers, decode=cpu'."""
        readers = "in process" if self.readers == "caller" else f"{self.readers} x{self.num_readers}"
        first = {"main": "first batch in main", "laid out ahead": "first window laid out ahead",
                 "readers": "first batch by the readers"}[self.first_batch]
        pools = [name for name, on in (("pooled buffers", self.pooled_reads or self.pooled_images),
                                       ("reused slabs", self.reuse_buffers)) if on]
        return ", ".join([f"readers={readers}", f"stream={self.stream}", first, *pools, f"decode={self.decode}"])

    def __str__(self) -> str:
        return self.describe()


def plan_execution(config: LoaderConfig, data: OpenedData, *, num_workers: int, cuda: bool) -> ExecutionPlan:
    """The one decision of how this loader runs (num_workers=0: in this process; `cuda`: a CUDA device here)."""
    decode = _decode_place(config, data, cuda=cuda)
    # "gpu": the workers stream undecoded (RAW where it can) batches, decoded in this process.
    stream = _stream_kind(config, data, "none" if decode == "gpu" else decode)
    readers = _readers(config, stream, num_workers)
    hooks = config.transform is not None or config.collate is not None
    first = "readers"
    if config.early_start and readers == "processes" and decode == "cpu" and not hooks and not config.reuse_buffers:
        first = "main"  # the main process decodes batch 0 with every core while the workers start
    elif config.early_start and readers == "caller" and stream == "raw" and _all_local(data, config):
        first = "laid out ahead"  # object storage waits for the iteration: no I/O for a loader never iterated
    pooled_images = (decode == "cpu" and config.pooled_buffers and not config.reuse_buffers and config.collate is None
                     and readers == "processes" and not (config.pin_memory and cuda))
    return ExecutionPlan(
        readers=readers, num_readers=0 if readers == "caller" else num_workers, stream=stream, decode=decode,
        first_batch=first, early_start=config.early_start and readers == "processes",
        pooled_reads=config.pooled_buffers and (stream == "by_sample" or stream == "tokens" and readers != "processes"),
        pooled_images=pooled_images,
        keep_slabs=config.reuse_buffers and readers == "processes", reuse_buffers=config.reuse_buffers)


def _decode_place(config: LoaderConfig, data: OpenedData, *, cuda: bool) -> str:
    """Where images are decoded. "auto": the GPU decoder beside the CPU workers where a device is and
    no hook needs samples on the CPU, else the CPU. "gpu" without a device keeps the GPU path, whose
    feed decodes on the CPU and says so once (loader/gpu_feed.py)."""
    if data.tokens is not None or config.decode is None:
        return "none"
    hooks = config.transform is not None or config.collate is not None
    if config.decode == "auto":
        return "cpu+gpu" if cuda and not hooks else "cpu"
    return str(config.decode)


def _stream_kind(config: LoaderConfig, data: OpenedData, decode: str) -> str:
    """RAW tar batches without per-sample objects where nothing needs samples (no decode, hook or label
    renaming); local tar shards decoded batch by batch; else sample dicts by windows."""
    if data.tokens is not None:
        return "tokens"
    manifests, stores = data.sources.manifests, data.sources.stores
    all_tar = all(m.format == "tar" for m in manifests)
    fields = data.fields
    one_label = fields is None or len(set(fields.label_fields)) <= 1
    if decode == "none" and config.transform is None and config.collate is None and all_tar and one_label:
        return "raw"
    if decode != "none" and config.cache_dir is None and all_tar and all(s.is_local for s in stores):
        return "by_sample"
    return "decoded"


def _readers(config: LoaderConfig, stream: str, num_workers: int) -> str:
    """Threads for RAW (I/O and copies release the GIL) and processes for decoding (its threads would
    take the GIL from the training loop) under worker_mode="auto"; token streams interleave in the
    caller's thread (a token batch is a few copies, cheaper than a hand-over between threads)."""
    if num_workers == 0:
        return "caller"
    if config.worker_mode != "auto":
        return config.worker_mode
    if stream == "tokens":
        return "caller"
    return "threads" if stream == "raw" else "processes"


def _all_local(data: OpenedData, config: LoaderConfig) -> bool:
    """Local files read without a disk cache: the RAW stream reads them straight into batches."""
    return hasattr(os, "preadv") and config.cache_dir is None and all(s.is_local for s in data.sources.stores)


def worker_job(config: LoaderConfig, data: OpenedData, plan: ExecutionPlan, topology: Topology) -> WorkerJob:
    """Everything a plan worker needs, built once from the plan (picklable: worker processes get a copy)."""
    opened, fields = data.sources, data.fields
    projections = fields.projections if fields is not None else (None,) * len(opened.stores)
    label_fields = fields.label_fields if fields is not None else ("",) * len(opened.stores)
    datasets = tuple(JobDataset(store=store, manifest=manifest, fields=projection, label_field=label)
                     for store, manifest, projection, label in zip(opened.stores, opened.manifests, projections,
                                                                  label_fields))
    decoding = plan.decode != "none"
    # The workers decode for "cpu" and "cpu+gpu" (less the tickets shipped raw), hand DALI undecoded
    # samples with their ids, and stream "gpu" batches as for no decode (the feed derives the ids).
    decode_at = {"cpu": "worker", "cpu+gpu": "worker", "dali": "main"}.get(plan.decode, "none")
    return WorkerJob(
        datasets=datasets, mixture=opened.mixture, plan_config=data.plan_config, topology=topology,
        verify_index=config.verify_index, verify_checksums=config.verify_checksums,
        decode_at=decode_at,
        decode_config=DecodeConfig(size=config.image_size, train=config.train, max_pixels=config.max_pixels)
        if decoding else None,
        image_fields=fields.image_fields if fields is not None else (), transform=config.transform,
        collate=config.collate, on_corrupt=config.on_corrupt,
        prefetch_bytes=read_ahead_bytes(config, decoding=decode_at != "none", mean_sample_bytes=mean_sample_bytes(opened.manifests)),
        max_in_flight=config.max_in_flight, cache_dir=config.cache_dir, cache_limit_bytes=config.cache_limit_bytes,
        slice_bytes=config.shuffle_window_bytes, reuse_buffers=config.reuse_buffers,
        pooled_images=plan.pooled_images, pooled_reads=plan.pooled_reads, stream=plan.stream, tokens=data.tokens,
        captions=caption_stage(opened.manifests, tokenizer=config.tokenizer, context_length=config.context_length,
                               seed=config.seed, urls=[s.url for s in opened.stores], stores=opened.stores))


def main_decoder(plan: ExecutionPlan, job: WorkerJob, config: LoaderConfig, *, url_of: Callable[[int], str],
                 split: Any = None, stats: Any = None) -> Any:
    """The decoder this process runs over the readers' batches (plan.decodes_in_main): an object whose
    `map(dataloader, epoch=)` yields them decoded, in order. DALI (decode/dali.py), or the GPU feed
    (loader/gpu_feed.py) for "gpu" and "cpu+gpu" (with the hybrid's `split`, reporting into `stats`)."""
    assert plan.decodes_in_main and job.decode_config is not None
    if plan.decode == "dali":
        from dataio.decode.dali import DaliDecoder

        return DaliDecoder(job.decode_config, batch_size=job.batch_size, seed=job.plan_config.seed,
                           num_threads=config.dali_threads, prefetch_queue_depth=2, on_corrupt=config.on_corrupt,
                           url_of=url_of, image_fields=job.image_fields)
    from dataio.loader.gpu_feed import GpuFeed

    return GpuFeed(job.decode_config, config, mixture=job.mixture, url_of=url_of, image_fields=job.image_fields,
                   split=split, stats=stats)
