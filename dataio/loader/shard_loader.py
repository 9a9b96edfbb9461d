"""The torch-facing loader: `make_loader(url, batch_size=...)` -> a ShardLoader iterated once per epoch.

make_loader is the one place that reads torch.distributed (rank and world size when not given);
below it a frozen Topology travels. The main process sends each DataLoader worker tickets
("batch k of this iteration, from plan state S"); each worker computes its own plan and streams
whole batches back (see worker.py). The state counts batches as they leave `__iter__` here, in the main process,
so it reflects what the training loop received, never what workers prefetched; every rank's
state is the same and loads into a loader of any world size and number of workers.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dataio.batch import ViewGuard
from dataio.decode.cpu import DecodeConfig
from dataio.errors import UnverifiedDataWarning
from dataio.format.manifest import Manifest
from dataio.loader.config import LoaderConfig, Source, mean_sample_bytes, read_ahead_bytes
from dataio.loader.facts import dataset_facts, where
from dataio.loader.first_batch import FirstBatch, first_batch_in_main
from dataio.loader.gpu_feed import GpuFeed, job_decode, resolved
from dataio.loader.hybrid import Split
from dataio.loader.history import HistoryKeeper
from dataio.loader.mixing import (
    OpenSources,
    as_sources,
    batch_fields,
    label_space_of,
    mixed_url_of,
    mixed_window_samples,
    open_sources,
)
from dataio.loader.position import PlanPosition
from dataio.loader.protocol import DatasetFacts
from dataio.loader.startup import ShardCheck, agree_on_dataset
from dataio.loader.state import make_state, saved_skips
from dataio.loader.stats import LoaderStats
from dataio.loader.threads import ReaderThreads
from dataio.loader.tickets import TicketSampler
from dataio.plan.skip import ids_to_ranges, in_ranges
from dataio.plan.types import PlanConfig, PlanState, Topology
from dataio.storage.store import Store
from dataio.stream.captions import caption_stage
from dataio.stream.collate import HEDGES_KEY, SKIPPED_KEY
from dataio.stream.image_slots import SlotReleaser
from dataio.stream.job import JobDataset, WorkerJob
from dataio.stream.raw import raw_fast_path
from dataio.stream.slabs import SlabKeeper, release_pooled
from dataio.stream.worker import BatchDataset


def note_unverified(stores: Sequence[Store], manifests: Sequence[Manifest]) -> None:
    """One UnverifiedDataWarning per dataset written before per-sample checksums (manifest version < 3)."""
    for store, manifest in zip(stores, manifests):
        if manifest.num_shards and not manifest.has_read_checksums:
            warnings.warn(UnverifiedDataWarning(
                f"{store.url}: written before per-sample checksums (manifest version {manifest.version}), so "
                "verify_checksums=True cannot check what is read from it: it loads unverified. Rewrite it with "
                "this shardify (`shardify write SRC DEST`) to have every read checked; `shardify verify "
                f"{store.url}` checks it whole meanwhile"), stacklevel=4)


class ShardLoader(PlanPosition):
    """Iterate once per epoch (`set_epoch(e)` first); `len()` is the steps per rank; Stateful.

    Iterating again without set_epoch repeats a finished epoch, or continues one left early;
    set_epoch(e) with the epoch of a loaded state keeps its position, any other epoch starts fresh.
    `make_loader` builds one; the `topology` (its plan workers read in worker processes or reader
    threads, or with `in_process` in this process: num_workers=0) and the start-up agreement's
    `kv_store` (None: this rank opens the dataset alone) are arguments here.
    """

    def __init__(self, url: str | Sequence[str | Source], config: LoaderConfig, *, topology: Topology,
                 in_process: bool = False, kv_store: Any = None) -> None:
        if in_process and topology.num_workers != 1:
            raise ValueError(f"an in-process loader plans 1 worker, not {topology.num_workers}")
        self.num_workers = 0 if in_process else topology.num_workers  # worker processes or reader threads
        config = resolved(config)  # decode="auto" without a CUDA device: "cpu"
        self.config = config
        self.topology = topology
        sources = as_sources(url, None)  # one dataset: a mixture of one

        def opener() -> tuple[OpenSources, str]:
            opened = open_sources(sources, config)
            return opened, opened.fingerprint

        if kv_store is not None:
            opened = agree_on_dataset(
                opener, rank=topology.rank, world_size=topology.world_size, timeout_s=config.startup_timeout_s,
                kv_store=kv_store,
            )
        else:
            opened = opener()[0]
        self._adopt(opened, sources)
        self.stats = LoaderStats()
        self._state = PlanState(epoch=0)  # where the current (or next) iteration starts
        self._delivered = 0  # batches handed to the caller since `_state`
        self._finished = False  # the last iteration ran to its end
        self._active_steps: int | None = None
        self._token = 0  # the iteration in progress (or last started): older generators stop
        self._sampler = TicketSampler()
        self._split = Split(num_workers=self.num_workers) if config.decode == "auto" else None  # hybrid.py
        self._sampler.raw_of = self._split.raw_of if self._split is not None else None
        self._gpu: GpuFeed | None = None
        self.history = HistoryKeeper()  # every pass of the run, for `shardify which` (loader/history.py)
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._threads: ReaderThreads | None = None
        self.uses_threads = self.num_workers > 0 and (
            config.worker_mode == "threads" or (config.worker_mode == "auto" and raw_fast_path(self._worker_job())))
        # Worker processes' slabs and pooled image storages stay mapped in this process while it
        # holds them (slabs.py, image_slots.py): a few per worker and field.
        kept = 4 * max(1, self.num_workers) * (config.prefetch_factor + 2)
        self._slab_keeper = SlabKeeper(kept) if config.reuse_buffers and not self.uses_threads else None
        self._slot_releaser = SlotReleaser(kept) if self._pools_images() else None
        self._dali: Any = None
        self._views: ViewGuard | None = None  # the per-sample views of the last reused-buffer batch
        in_main = first_batch_in_main(config, uses_threads=self.uses_threads, num_workers=self.num_workers)
        self._first = (FirstBatch(self._worker_job(), num_threads=min(self.num_workers, os.cpu_count() or 1))
                       if in_main else None)
        if config.early_start and self.num_workers > 0 and not self.uses_threads:
            self._start_workers()
        elif config.early_start and self.num_workers == 0:
            # RAW in this process: the first window's indexes and layout are made in a thread while
            # the caller goes on (worker.py bet_in_process).
            self._get_dataloader().dataset.bet_in_process(self._next_start())

    def _adopt(self, opened: OpenSources, sources: list[Source]) -> None:
        """What the opened sources fix: fields, labels, facts and the plan's settings."""
        config = self.config
        self.opened = opened
        self.mixture = opened.mixture  # Mixture.single: one dataset
        self.store, self.manifest = opened.stores[0], opened.manifests[0]  # the first source's
        self.fingerprint = opened.fingerprint
        self._fields = batch_fields(opened, config)
        self.image_fields = self._fields.image_fields
        self.labels = label_space_of(sources, opened, config)  # labels checked, mapped per source
        self.label_names = self.labels.names  # the batches' label names (None: the data names none)
        self.num_classes = len(self.label_names) if self.label_names else None
        self.facts: DatasetFacts = dataset_facts(opened, self.labels)  # what a trainer reads (protocol.py)
        if config.verify_checksums and self.topology.rank == 0:
            note_unverified(opened.stores, opened.manifests)
        self.plan_config = PlanConfig(
            seed=config.seed, batch_size=config.batch_size, tail=config.tail, shuffle=config.shuffle,
            shuffle_window=mixed_window_samples(opened, config),
        )
        self._shard_check = ShardCheck(list(zip(opened.stores, opened.manifests)), enabled=config.check_shards)

    def _start_workers(self) -> None:
        """Fork (or spawn) the worker processes now: each opens its slot's stream from where the
        first iteration will probably start and reads its first window, then waits for tickets."""
        start = self._next_start()
        head = self._first.head(start) if self._first is not None else 0
        self._sampler.warm(start, head, self.num_workers)
        iter(self._get_dataloader())  # starts the persistent workers and sends them the warm tickets
        if self._first is not None:
            self._first.warm_up(start)  # threads only after the fork

    def where(self, batch: dict[str, Any], i: int) -> str:
        """' in shard URL' (+ ' of source N (URL)' in a mixture) for sample i of a batch."""
        return where(self.opened, batch, i)

    # --- skips and length (topology, epoch and run history: loader/position.py) ---------------
    def skip(self, ids: Sequence[int]) -> None:
        """Drop these global sample ids from the rest of the run: the rest of this epoch (whatever
        was not yet delivered) and every later epoch, which shrinks by their count. Between
        iterations; the state records them, so every later resume keeps skipping (plan/skip.py)."""
        if self._active_steps is not None:
            raise RuntimeError("skip() during an iteration; call it between iterations (after load_state_dict)")
        start = self._next_start()
        ranges = checked_skip(ids, self.mixture, already=start.skipped_ids())
        if not ranges:  # nothing new (a relaunch with the same --skip-steps): the order stays as it was
            return
        self._record_history(new_pass=self._finished)
        self._state, self._delivered, self._finished = start.skipping(ranges), 0, False

    @property
    def skipped(self) -> tuple[tuple[int, int], ...]:
        """Every sample id range this loader skips, [a, b) sorted."""
        return self._state.skipped_ids()

    def _position(self) -> PlanState:
        """The PlanState after everything delivered so far."""
        if self._delivered == 0:
            return self._state
        t = self.topology
        return self._state.advanced(world_size=t.world_size, num_workers=t.num_workers, batches=self._delivered)

    def _next_start(self) -> PlanState:
        return self._state.next_epoch(self._state.epoch) if self._finished else self._position()

    def _steps_from(self, state: PlanState) -> int:
        # A mixture's epoch (each schedule segment's) is first rounded down to the global batch (one: not).
        return int(self.mixture.steps_from(config=self.plan_config, world_size=self.topology.world_size, state=state))

    def __len__(self) -> int:
        """Batches this rank gets in the current iteration (or the next one, between iterations)."""
        if self._active_steps is not None:
            return self._active_steps
        return self._steps_from(self._next_start())

    # --- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._views is not None:  # a new iteration rewrites every slab: the last batch's views go
            self._views.release()
        start = self._next_start()
        self._record_history(new_pass=self._finished)
        self._state, self._delivered, self._finished = start, 0, False
        steps = self._steps_from(start)
        self._token += 1
        head = self._first.head(start) if self._first is not None and steps > 0 else 0
        self._sampler.start(self._token, start, steps, head)
        self._active_steps = steps
        if self.uses_threads:
            if self._threads is None:
                c = self.config
                self._threads = ReaderThreads(self._worker_job(), num_workers=self.num_workers,
                                              prefetch_factor=c.prefetch_factor, pin_memory=c.pin_memory)
            sampler = self._sampler
            batches = self._threads.iterate(self._token, start, steps, lambda: sampler.released_below)
            return self._deliver(batches, self._token, steps)
        if head:
            token = self._token
            first = self._first.then_workers(start, head, self._get_dataloader(), pin_memory=self.config.pin_memory,
                                             is_current=lambda: token == self._token)
            return self._deliver(first, self._token, steps)
        return self._deliver(self._get_dataloader(), self._token, steps)

    def _deliver(self, dataloader: Any, token: int, steps: int) -> Iterator[dict[str, Any]]:
        if token != self._token:
            raise RuntimeError("this loader started a newer iteration before this one began; use that one")
        if self.config.decode in ("gpu", "auto"):  # a thread decodes ahead on the GPU (the last one's stopped first)
            batches: Iterator[Any] = self._gpu_feed().map(dataloader, epoch=self._state.epoch)
        else:
            batches = iter(dataloader)
        if self.config.decode == "dali":
            batches = self._dali_decoder().map(batches)  # a few batches in flight inside DALI
        try:
            for batch in batches:
                if token != self._token:
                    raise RuntimeError("this loader started a newer iteration; an old iterator cannot continue")
                if isinstance(batch, dict):
                    skipped = batch.pop(SKIPPED_KEY, None)
                    if skipped:
                        self.stats.add_skipped(skipped)
                    hedges = batch.pop(HEDGES_KEY, None)
                    if hedges:
                        self.stats.add_hedges(hedges)
                    if self.config.decode == "dali":
                        batch.pop("__id__", None), batch.pop("epoch", None)
                    batch = self.labels.apply(batch)
                self._shard_check.poll()  # missing shards, listed beside the first batches
                self._delivered += 1  # counted as it leaves: the state is what the caller got
                if self._slab_keeper is not None:
                    self._slab_keeper.keep(batch)
                if self._slot_releaser is not None:  # the workers may reuse what the caller let go
                    self._slot_releaser.keep(batch)
                    self._slot_releaser.release_unused()
                    # The first batch's buffers (made here) go back once it is dropped: the workers
                    # make the rest, so here they would only sit until the next iteration's first.
                    release_pooled()
                guard = ViewGuard() if self.config.reuse_buffers and isinstance(batch, dict) else None
                if guard is not None:  # per-sample views live as long as the slab (batch.py)
                    self._views, batch = guard, guard.attach(batch)
                yield batch
                self._shard_check.start()  # after the first batch, never on its path
                # The caller asks for the next batch: the one it held may be overwritten (slabs.py).
                if guard is not None:
                    guard.release()
                self._sampler.released_below = self._delivered
            self._shard_check.finish()
            self._finished = self._delivered == steps
        finally:
            if hasattr(batches, "close"):
                batches.close()  # stops DALI's queue (or the DataLoader iterator) of this iteration
            if token == self._token:
                self._active_steps = None
            if self.num_workers == 0 and self._dataloader is not None:
                self._dataloader.dataset.close()  # in-process streams: stop their prefetch threads

    def _get_dataloader(self) -> torch.utils.data.DataLoader:
        if self._dataloader is None:
            workers = self.num_workers
            self._dataloader = torch.utils.data.DataLoader(
                BatchDataset(self._worker_job()),
                batch_size=None,
                sampler=self._sampler,
                collate_fn=_identity,
                num_workers=workers,
                persistent_workers=workers > 0,
                prefetch_factor=self.config.prefetch_factor if workers > 0 else None,
                pin_memory=self.config.pin_memory,
                multiprocessing_context=self.config.multiprocessing_context if workers > 0 else None,
            )
        return self._dataloader

    def _decode_config(self) -> Any:
        """The DecodeConfig for decode='cpu' or 'dali' (None for raw batches)."""
        c = self.config
        if c.decode is None:
            return None
        return DecodeConfig(size=c.image_size, train=c.train, max_pixels=c.max_pixels)

    def _worker_job(self) -> WorkerJob:
        c, opened, fields = self.config, self.opened, self._fields
        datasets = tuple(JobDataset(store=store, manifest=manifest, fields=projection, label_field=label)
                         for store, manifest, projection, label in zip(opened.stores, opened.manifests,
                                                                      fields.projections, fields.label_fields))
        return WorkerJob(
            datasets=datasets, mixture=self.mixture, plan_config=self.plan_config, topology=self.topology,
            verify_index=c.verify_index, decode=job_decode(c.decode), decode_config=self._decode_config(),
            verify_checksums=c.verify_checksums,
            image_fields=self.image_fields, transform=c.transform, collate=c.collate, on_corrupt=c.on_corrupt,
            prefetch_bytes=read_ahead_bytes(c, decoding=job_decode(c.decode) is not None,
                                            mean_sample_bytes=mean_sample_bytes(opened.manifests)),
            max_in_flight=c.max_in_flight, cache_dir=c.cache_dir,
            cache_limit_bytes=c.cache_limit_bytes, slice_bytes=c.shuffle_window_bytes, reuse_buffers=c.reuse_buffers,
            pooled_images=self._pools_images(), pooled_reads=c.pooled_buffers,
            captions=caption_stage(opened.manifests, tokenizer=c.tokenizer, context_length=c.context_length,
                                   seed=c.seed, urls=[s.url for s in opened.stores]),
        )

    def _pools_images(self) -> bool:
        """Whether worker processes decode into pooled storages this process releases (image_slots.py):
        it must see each batch's own image tensor, so not with a collate hook, nor when the
        DataLoader pins batches (the pinned copy replaces it)."""
        c = self.config
        return (c.decode == "cpu" and c.pooled_buffers and not c.reuse_buffers and c.collate is None and self.num_workers > 0
                and not getattr(self, "uses_threads", True)  # undecided while the first job is built
                and not (c.pin_memory and torch.cuda.is_available()))

    def _dali_decoder(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        if self._dali is None:
            from dataio.decode.dali import DaliDecoder

            self._dali = DaliDecoder(
                self._decode_config(), batch_size=self.config.batch_size, seed=self.config.seed,
                num_threads=self.config.dali_threads, prefetch_queue_depth=2,
                on_corrupt=self.config.on_corrupt, url_of=mixed_url_of(self.opened),
                image_fields=self.image_fields,
            )
        return self._dali

    def _gpu_feed(self) -> GpuFeed:
        if self._gpu is None:
            self._gpu = GpuFeed(self._decode_config(), self.config, mixture=self.mixture, url_of=mixed_url_of(self.opened),
                                image_fields=self.image_fields, split=self._split, stats=self.stats)
        return self._gpu

    # --- Stateful (torch.distributed.checkpoint) -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What has been delivered so far, in a form any rank of any topology can load."""
        state = make_state(self._position(), fingerprint=self.fingerprint, plan_config=self.plan_config,
                           mixture=self.mixture, epoch_complete=self._finished and self._active_steps is None)
        return self._with_history(state)

    def load_history(self, state_dict: dict[str, Any]) -> None:
        """Take only the run's history from a saved state (an epoch-end checkpoint, not resumed), and
        its skip list: the next epochs keep skipping."""
        self.history.load(state_dict, self._state, fingerprint=self.fingerprint, plan=self.plan_config)
        ranges = saved_skips(state_dict)
        if ranges and self._active_steps is None:
            self._state = self._next_start().skipping(ranges)
            self._delivered, self._finished = 0, False

    def close(self) -> None:
        """Stop the worker processes or reader threads now (processes also stop when the loader is
        garbage collected)."""
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        if self._first is not None:
            self._first.close()
        release_pooled()  # batch storages nobody holds any more
        if self._dataloader is not None:
            self._dataloader.dataset.close()
            iterator = getattr(self._dataloader, "_iterator", None)
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            self._dataloader = None

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def checked_skip(ids: Sequence[int], mixture: Any, already: Sequence[tuple[int, int]] = ()) -> tuple[tuple[int, int], ...]:
    """The ids not `already` skipped, as ranges; ValueError for ids outside the data."""
    array = np.asarray(list(ids), dtype=np.int64)
    total = int(mixture.id_base[-1])
    bad = array[(array < 0) | (array >= total)]
    if len(bad):
        raise ValueError(f"cannot skip sample id {int(bad[0])}: ids of this data run from 0 to {total - 1} "
                         "(global ids: the sources' samples concatenated, in manifest order)")
    return ids_to_ranges(array[~in_ranges(array, already)])


def _identity(batch: Any) -> Any:
    return batch

