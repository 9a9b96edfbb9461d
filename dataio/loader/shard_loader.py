"""The torch-facing loader: `make_loader(url, batch_size=...)` -> a ShardLoader iterated once per epoch.

make_loader is the one place that reads torch.distributed (rank and world size when not given);
below it a frozen Topology travels. How the batches are made is decided once, when the loader is
built (loader/execution.py: who reads, the stream kind, where decoding runs), for samples and token
datasets alike. The main process sends each plan worker tickets ("batch k of this iteration, from
plan state S"), through DataLoader worker processes, reader threads or in this process; each worker
computes its own plan and streams whole batches back (see stream/worker.py). The state counts batches as they leave `__iter__` here, in the main process,
so it reflects what the training loop received, never what workers prefetched; every rank's
state is the same and loads into a loader of any world size and number of workers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dataio.batch import ViewGuard
from dataio.loader.config import LoaderConfig, Source
from dataio.loader.execution import main_decoder, plan_execution, worker_job
from dataio.loader.gpu_feed import device
from dataio.loader.hybrid import Split
from dataio.loader.first_batch import FirstBatch
from dataio.loader.history import HistoryKeeper
from dataio.loader.mixing import as_sources, mixed_url_of
from dataio.loader.opened import OpenedData, open_agreed
from dataio.loader.position import PlanPosition
from dataio.loader.protocol import DatasetFacts
from dataio.loader.startup import ShardCheck
from dataio.loader.state import make_state, saved_skips
from dataio.loader.stats import LoaderStats
from dataio.loader.threads import ReaderThreads
from dataio.loader.tickets import TicketSampler
from dataio.plan.skip import ids_to_ranges, in_ranges
from dataio.plan.types import PlanState, Topology
from dataio.stream.collate import HEDGES_KEY, SKIPPED_KEY
from dataio.stream.image_slots import SlotReleaser
from dataio.stream.slabs import SlabKeeper, release_pooled
from dataio.stream.worker import BatchDataset


class ShardLoader(PlanPosition):
    """Iterate once per epoch (`set_epoch(e)` first); `len()` is the steps per rank; Stateful.

    One loader for every dataset: samples (images or not) and token datasets (`seq_len`: batches of
    packed sequences) take the same path, from opening (loader/opened.py) through the execution plan
    (loader/execution.py), tickets and streams to state and resume; only the stream kind differs.
    Iterating again without set_epoch repeats a finished epoch, or continues one left early;
    set_epoch(e) with the epoch of a loaded state keeps its position, any other epoch starts fresh.
    `make_loader` builds one; the `topology` (its plan workers read in worker processes or reader
    threads, or with `num_workers=0` in this process) and the start-up agreement's
    `kv_store` (None: this rank opens the dataset alone) are arguments here.
    """

    def __init__(self, url: str | Sequence[str | Source], config: LoaderConfig, *, topology: Topology,
                 num_workers: int | None = None, kv_store: Any = None) -> None:
        num_workers = topology.num_workers if num_workers is None else num_workers  # make_loader's (0: here)
        if num_workers == 0 and topology.num_workers != 1:
            raise ValueError(f"a loader reading in this process (num_workers=0) plans 1 worker, not {topology.num_workers}")
        self.config, self.topology = config, topology
        self._adopt(open_agreed(as_sources(url, None), config, topology=topology, kv_store=kv_store))
        # How batches are made, decided once (loader/execution.py); the workers' job is built from it.
        self.execution = plan_execution(config, self.data, num_workers=num_workers, cuda=device() is not None)
        self.job = worker_job(config, self.data, self.execution, topology)
        self.num_workers = self.execution.num_readers  # worker processes or reader threads (0: in process)
        self.stats = LoaderStats(execution=str(self.execution))  # the plan's line
        self._state = PlanState(epoch=0)  # where the current (or next) iteration starts
        self._delivered = 0  # batches handed to the caller since `_state`
        self._finished = False  # the last iteration ran to its end
        self._active_steps: int | None = None
        self._token = 0  # the iteration in progress (or last started): older generators stop
        self._sampler = TicketSampler()
        # decode="auto" on a CUDA device: which batches the workers ship raw for the GPU (hybrid.py)
        self._split = Split(num_workers=self.num_workers) if self.execution.hybrid else None
        self._sampler.raw_of = self._split.raw_of if self._split is not None else None
        self.history = HistoryKeeper()  # every pass of the run, for `shardify which` (loader/history.py)
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._threads: ReaderThreads | None = None
        # Worker processes' slabs and pooled image storages stay mapped in this process while it
        # holds them (slabs.py, image_slots.py): a few per worker and field.
        kept = 4 * max(1, self.num_workers) * (config.prefetch_factor + 2)
        self._slab_keeper = SlabKeeper(kept) if self.execution.keep_slabs else None
        self._slot_releaser = SlotReleaser(kept) if self.execution.pooled_images else None
        self._decoder: Any = None  # a decoder in this process (DALI, the GPU), made at the first batch
        self._views: ViewGuard | None = None  # the per-sample views of the last reused-buffer batch
        self._first_batch: FirstBatch | None = None  # made at start() or the first iteration

    def start(self) -> ShardLoader:
        """Start now what the execution plan starts early (make_loader calls it): worker processes, each
        reading its first window, or the first window laid out in a thread (RAW in this process); the
        first iteration starts them otherwise. Returns the loader."""
        if self.execution.early_start and self._dataloader is None:
            self._start_workers()
        elif self.execution.first_batch == "laid out ahead" and self._dataloader is None:
            # RAW in this process: the first window's indexes and layout are made in a thread while
            # the caller goes on (worker.py bet_here).
            self._get_dataloader().dataset.bet_here(self._next_start())
        return self

    @property
    def _first(self) -> FirstBatch | None:
        """What makes each iteration's first batch here (the plan's first_batch="main"), made once."""
        if self._first_batch is None and self.execution.first_batch == "main":
            self._first_batch = FirstBatch(self.job, num_threads=min(self.num_workers, os.cpu_count() or 1))
        return self._first_batch

    def describe(self) -> str:
        """How this loader makes its batches, in one line (the execution plan)."""
        return self.execution.describe()

    @property
    def facts(self) -> DatasetFacts:
        """What a trainer reads of the data (protocol.py): identity, size, mean stored sample, sources."""
        return self.data.facts

    def _adopt(self, data: OpenedData) -> None:
        """What the opened sources fix: their kind's plan settings, facts, labels."""
        self.data = data
        self.opened = data.sources
        self.mixture = data.sources.mixture  # Mixture.single: one dataset
        self.store, self.manifest = data.sources.stores[0], data.sources.manifests[0]  # the first source's
        self.fingerprint = data.fingerprint
        self.plan_config = data.plan_config
        self.labels = data.labels  # samples: labels checked, mapped per source (None: tokens)
        self.label_names = data.label_names  # the batches' label names (None: the data names none)
        self.num_classes = data.num_classes
        self.image_fields = data.fields.image_fields if data.fields is not None else ()
        datasets = list(zip(data.sources.stores, data.sources.manifests))
        self._shard_check = ShardCheck(datasets, enabled=self.config.check_shards and data.tokens is None)

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
        """' in shard URL' (+ ' of source N (URL)' in a mixture) for sample i of a batch ('' for tokens)."""
        return self.data.where(batch, i)

    # --- skips and length (topology, epoch and run history: loader/position.py) ---------------
    def skip(self, ids: Sequence[int]) -> None:
        """Drop these global sample ids from the rest of the run: the rest of this epoch (whatever
        was not yet delivered) and every later epoch, which shrinks by their count. Between
        iterations; the state records them, so every later resume keeps skipping (plan/skip.py)."""
        if self._active_steps is not None:
            raise RuntimeError("skip() during an iteration; call it between iterations (after load_state_dict)")
        if self.data.tokens is not None:
            raise ValueError("skip() takes sample ids of a dataset of samples; a token loader has no skip list")
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
        return self.data.steps_from(state, self.topology.world_size)

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
        if self.execution.readers == "threads":
            if self._threads is None:
                c = self.config
                self._threads = ReaderThreads(self.job, num_workers=self.num_workers,
                                              prefetch_factor=c.prefetch_factor, pin_memory=c.pin_memory)
            sampler = self._sampler
            batches = self._threads.iterate(self._token, start, steps, lambda: sampler.released_below)
            return self._deliver(batches, self._token, steps)
        if head:
            token = self._token
            first = self._first.then_workers(start, head, self._get_dataloader(), pin_memory=self.config.pin_memory,
                                             is_current=lambda: token == self._token)
            return self._deliver(first, self._token, steps)
        if self.execution.readers == "caller":
            return self._deliver(self._in_caller(), self._token, steps)
        return self._deliver(self._get_dataloader(), self._token, steps)

    def _in_caller(self) -> Iterator[Any]:
        """The iteration's batches made in this thread, ticket by ticket: what DataLoader(num_workers=0)
        does, without its per-batch bookkeeping (a token batch takes tens of microseconds)."""
        dataset = self._get_dataloader().dataset
        pin = self.config.pin_memory and torch.cuda.is_available()
        for ticket in self._sampler:
            batch = dataset[ticket]
            if pin:
                from torch.utils.data._utils.pin_memory import pin_memory

                batch = pin_memory(batch)
            yield batch

    def _deliver(self, dataloader: Any, token: int, steps: int) -> Iterator[dict[str, Any]]:
        if token != self._token:
            raise RuntimeError("this loader started a newer iteration before this one began; use that one")
        in_main = self.execution.decodes_in_main
        if in_main:
            if self._decoder is None:
                self._decoder = main_decoder(self.execution, self.job, self.config, url_of=mixed_url_of(self.opened),
                                             split=self._split, stats=self.stats)
            # A few batches in flight inside the decoder; it takes the DataLoader itself, so the GPU
            # feed stops the last iteration's thread before iter() resets a persistent iterator.
            batches: Iterator[Any] = self._decoder.map(dataloader, epoch=self._state.epoch)
        else:
            batches = iter(dataloader)
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
                    if in_main:
                        batch.pop("__id__", None), batch.pop("epoch", None)
                    if self.labels is not None:
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
                if self._slot_releaser is not None:  # asked for the next: what the caller dropped goes
                    self._slot_releaser.release_unused()  # back now, not once the next batch arrives
                self._shard_check.start()  # after the first batch, never on its path
                # The caller asks for the next batch: the one it held may be overwritten (slabs.py).
                if guard is not None:
                    guard.release()
                self._sampler.released_below = self._delivered
            if token != self._token:  # a decoder's thread stopped for a newer iteration ends its batches early
                raise RuntimeError("this loader started a newer iteration; an old iterator cannot continue")
            self._shard_check.finish()
            self._finished = self._delivered == steps
        finally:
            if hasattr(batches, "close"):
                batches.close()  # stops DALI's queue (or the DataLoader iterator) of this iteration
            if token == self._token:
                self._active_steps = None
            if self.execution.readers == "caller" and self._dataloader is not None:
                self._dataloader.dataset.close()  # in-process streams: stop their prefetch threads

    def _get_dataloader(self) -> torch.utils.data.DataLoader:
        if self._dataloader is None:
            workers = self.num_workers if self.execution.readers == "processes" else 0
            self._dataloader = torch.utils.data.DataLoader(
                BatchDataset(self.job),
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

    # --- Stateful (torch.distributed.checkpoint) -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What has been delivered so far, in a form any rank of any topology can load."""
        state = make_state(self._position(), fingerprint=self.fingerprint, plan_config=self.plan_config,
                           mixture=self.mixture, epoch_complete=self._finished and self._active_steps is None)
        return self._with_history({**state, **self.data.state_extra()})

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
        if self._first_batch is not None:
            self._first_batch.close()
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

