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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dataio.batch import ViewGuard
from dataio.decode.cpu import DecodeConfig
from dataio.decode.images import DEFAULT_MAX_PIXELS
from dataio.errors import StateError, UnverifiedDataWarning
from dataio.format.manifest import Manifest
from dataio.loader.collate import HEDGES_KEY, SKIPPED_KEY
from dataio.loader.config import LoaderConfig, MiB, Source, check_int, window_samples
from dataio.loader.first_batch import FirstBatch, first_batch_in_main
from dataio.loader.mixing import (
    OpenSources,
    as_sources,
    batch_fields,
    label_space_of,
    mixed_url_of,
    mixed_window_samples,
    open_sources,
    plain_url,
)
from dataio.loader.raw import raw_fast_path
from dataio.loader.slabs import SlabKeeper, release_pooled
from dataio.loader.startup import ShardCheck, agree_on_dataset, fields_to_read, open_dataset
from dataio.loader.state import check_state, make_state
from dataio.loader.threads import ReaderThreads
from dataio.loader.worker import BatchDataset, Ticket, WorkerJob
from dataio.plan.mix import Mixture, delivered_epoch
from dataio.plan.plan import steps_of_total
from dataio.plan.types import PlanConfig, PlanState, Topology
from dataio.readers.base import sample_url_of
from dataio.storage.store import StorageOptions, Store


@dataclass
class LoaderStats:
    """What the loader counted in the main process: corrupt samples replaced under on_corrupt='skip',
    hedged reads reported by the workers."""

    corrupt_skipped: int = 0
    corrupt_keys: list[str] = field(default_factory=list)  # "shard URL#sample key", first 1000
    # Ranged reads in the workers, how many got a hedge (a second request after a slow start),
    # how many of those the hedge won, and slow reads left alone because the budget was spent.
    ranged_reads: int = 0
    hedged_reads: int = 0
    hedges_won: int = 0
    hedges_over_budget: int = 0

    def add_hedges(self, counts: dict[str, int]) -> None:
        self.ranged_reads += counts.get("requests", 0)
        self.hedged_reads += counts.get("hedged", 0)
        self.hedges_won += counts.get("won", 0)
        self.hedges_over_budget += counts.get("over_budget", 0)

    def add_skipped(self, keys: Sequence[str]) -> None:
        self.corrupt_skipped += len(keys)
        self.corrupt_keys.extend(keys[: max(0, 1000 - len(self.corrupt_keys))])


def make_loader(
    url: str | Sequence[str | Source],
    *,
    batch_size: int,
    weights: Sequence[float] | None = None,
    epoch_samples: int | None = None,
    num_workers: int = 2,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    decode: str | None = "cpu",
    image_size: int = 224,
    train: bool = True,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    tail: str = "drop",
    shuffle: bool = True,
    shuffle_window: int = 4096,
    shuffle_window_bytes: int | None = 128 * MiB,
    fields: Sequence[str] | None = None,
    transform: Callable[..., Any] | None = None,
    collate: Callable[[list[dict[str, Any]]], Any] | None = None,
    on_corrupt: str = "raise",
    prefetch_bytes: int = 128 * MiB,
    max_in_flight: int = 8,
    cache_dir: str | None = None,
    cache_limit_bytes: int | None = None,
    storage: StorageOptions | None = None,
    verify_index: bool = True,
    verify_checksums: bool = True,
    check_shards: bool = True,
    pin_memory: bool = False,
    multiprocessing_context: str | None = None,
    prefetch_factor: int = 2,
    startup_timeout_s: float = 300.0,
    dali_threads: int = 2,
    reuse_buffers: bool = False,
    worker_mode: str = "auto",
    early_start: bool = True,
    label_space: str | Mapping[str, Any] = "same",
) -> ShardLoader:
    """Open the dataset at `url` and return a ShardLoader; batch_size is per rank (see LoaderConfig).

    Several URLs (with `weights`, or Source objects with weight= or repeat=) make a mixture: one
    epoch of `epoch_samples` (default: the sources' sizes summed) split between the sources by
    weight, and each batch's "source" tensor says where every sample came from (plan/mix.py);
    `label_space` gives their labels one space ("same", "union" or a map: loader/labels.py).
    rank and world_size default to torch.distributed's when its default group is initialised.
    """
    options = dict(locals())
    del options["url"], options["weights"]
    config = LoaderConfig(**options)
    topology, kv_store = job_topology(config)
    sources = as_sources(url, weights)
    return ShardLoader(plain_url(url) if sources is None else sources, config, topology=topology,
                       kv_store=kv_store)


def job_topology(config: LoaderConfig) -> tuple[Topology, Any]:
    """(topology, key-value store for the ranks' start-up agreement, or None): the one place the
    loader reads torch.distributed.

    rank and world_size come from the config when given, else from the initialised default process
    group, else (0, 1). The ranks agree on the dataset through the group's store only when this
    loader is its process's rank of that group.
    """
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    if config.world_size is not None:
        rank, world_size = int(config.rank), int(config.world_size)  # type: ignore[arg-type]
        in_group = initialised and (rank, world_size) == (dist.get_rank(), dist.get_world_size())
    elif initialised:
        rank, world_size, in_group = dist.get_rank(), dist.get_world_size(), True
    else:
        rank, world_size, in_group = 0, 1, False
    topology = Topology(rank=rank, world_size=world_size, num_workers=max(1, config.num_workers))
    if not (in_group and world_size > 1):
        return topology, None
    from torch.distributed import distributed_c10d

    return topology, distributed_c10d._get_default_store()


def note_unverified(stores: Sequence[Store], manifests: Sequence[Manifest]) -> None:
    """One UnverifiedDataWarning per dataset written before per-sample checksums (manifest version < 3)."""
    for store, manifest in zip(stores, manifests):
        if manifest.num_shards and not manifest.has_read_checksums:
            warnings.warn(UnverifiedDataWarning(
                f"{store.url}: written before per-sample checksums (manifest version {manifest.version}), so "
                "verify_checksums=True cannot check what is read from it: it loads unverified. Rewrite it with "
                "this shardify (`shardify write SRC DEST`) to have every read checked; `shardify verify "
                f"{store.url}` checks it whole meanwhile"), stacklevel=4)


class ShardLoader:
    """Iterate once per epoch (`set_epoch(e)` first); `len()` is the steps per rank; Stateful.

    Iterating again without set_epoch repeats a finished epoch, or continues one left early;
    set_epoch(e) with the epoch of a loaded state keeps its position, any other epoch starts fresh.
    `make_loader` builds one; `topology` (plan workers: max(1, config.num_workers)) and the
    start-up agreement's `kv_store` (None: this rank opens the dataset alone) are arguments here.
    """

    def __init__(self, url: str | Sequence[Source], config: LoaderConfig, *, topology: Topology,
                 kv_store: Any = None) -> None:
        if topology.num_workers != max(1, config.num_workers):
            raise ValueError(f"topology plans {topology.num_workers} workers but num_workers is {config.num_workers}")
        if config.world_size is not None and (config.rank, config.world_size) != (topology.rank, topology.world_size):
            raise ValueError(f"topology {topology} differs from the config's rank and world_size")
        self.config = config
        self.topology = topology
        self.mixture: Mixture | None = None  # several sources (plan/mix.py); None: one dataset
        self.sources: OpenSources | None = None

        def opener() -> tuple[Any, str]:
            if not isinstance(url, str):
                opened = open_sources(url, config)
                return opened, opened.fingerprint
            store, manifest = open_dataset(url, config)
            return (store, manifest), manifest.fingerprint

        if kv_store is not None:
            opened = agree_on_dataset(
                opener, rank=topology.rank, world_size=topology.world_size, timeout_s=config.startup_timeout_s,
                kv_store=kv_store,
            )
        else:
            opened = opener()[0]
        if isinstance(opened, OpenSources):  # store and manifest: the first source's
            self.sources, self.mixture = opened, opened.mixture
            self.store, self.manifest, self.fingerprint = opened.stores[0], opened.manifests[0], opened.fingerprint
            self._mixed = batch_fields(opened, config)
            self.image_fields, self.read_fields = self._mixed.image_fields, self._mixed.projections[0]
            window, self._total = mixed_window_samples(opened, config), opened.mixture.total
        else:
            self.store, self.manifest = opened
            self.fingerprint = self.manifest.fingerprint
            self.image_fields, self.read_fields = fields_to_read(self.manifest, config, self.store.url)
            window, self._total = window_samples(self.manifest, config), self.manifest.num_samples
        stores, manifests = (self.sources.stores, self.sources.manifests) if self.sources else (
            [self.store], [self.manifest])
        self.labels = label_space_of(url, stores, manifests, config)  # labels checked, mapped per source
        self.label_names = self.labels.names  # the batches' label names (None: the data names none)
        if config.verify_checksums and topology.rank == 0:
            note_unverified(stores, manifests)
        self.plan_config = PlanConfig(
            seed=config.seed, batch_size=config.batch_size, tail=config.tail, shuffle=config.shuffle,
            shuffle_window=window,
        )
        datasets = list(zip(self.sources.stores, self.sources.manifests)) if self.sources else [(self.store, self.manifest)]
        self._shard_check = ShardCheck(datasets, enabled=config.check_shards)
        self.stats = LoaderStats()
        self._sizes = self.manifest.shard_num_samples  # a tuple, or (parted) an int64 array
        self._state = PlanState(epoch=0)  # where the current (or next) iteration starts
        self._delivered = 0  # batches handed to the caller since `_state`
        self._finished = False  # the last iteration ran to its end
        self._active_steps: int | None = None
        self._token = 0  # the iteration in progress (or last started): older generators stop
        self._sampler = _TicketSampler()
        self._dataloader: torch.utils.data.DataLoader | None = None
        self._threads: ReaderThreads | None = None
        self.uses_threads = config.num_workers > 0 and (
            config.worker_mode == "threads" or (config.worker_mode == "auto" and raw_fast_path(self._worker_job())))
        # Worker processes' slabs stay mapped in this process while it holds them (slabs.py).
        self._slab_keeper = (SlabKeeper(max_storages=4 * max(1, config.num_workers) * (config.prefetch_factor + 2))
                             if config.reuse_buffers and not self.uses_threads else None)
        self._dali: Any = None
        self._views: ViewGuard | None = None  # the per-sample views of the last reused-buffer batch
        self._first = (FirstBatch(self._worker_job(), num_threads=min(config.num_workers, os.cpu_count() or 1))
                       if first_batch_in_main(config, uses_threads=self.uses_threads) else None)
        if config.early_start and config.num_workers > 0 and not self.uses_threads:
            self._start_workers()
        elif config.early_start and config.num_workers == 0:
            # RAW in this process: the first window's indexes and layout are made in a thread while
            # the caller goes on (worker.py bet_in_process).
            self._get_dataloader().dataset.bet_in_process(self._next_start())

    def _start_workers(self) -> None:
        """Fork (or spawn) the worker processes now: each opens its slot's stream from where the
        first iteration will probably start and reads its first window, then waits for tickets."""
        start = self._next_start()
        head = self._first.head(start) if self._first is not None else 0
        self._sampler.warm(start, head, self.config.num_workers)
        iter(self._get_dataloader())  # starts the persistent workers and sends them the warm tickets
        if self._first is not None:
            self._first.warm_up(start)  # threads only after the fork

    # --- topology, epochs and length ---------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def epoch(self) -> int:
        return int(self._state.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration delivers; a resumed epoch keeps its position."""
        check_int("epoch", epoch, minimum=0)
        if epoch != self._state.epoch or self._finished:
            self._state, self._delivered, self._finished = PlanState(epoch=epoch), 0, False

    def _position(self) -> PlanState:
        """The PlanState after everything delivered so far."""
        if self._delivered == 0:
            return self._state
        t = self.topology
        return self._state.advanced(world_size=t.world_size, num_workers=t.num_workers, batches=self._delivered)

    def _next_start(self) -> PlanState:
        return PlanState(epoch=self._state.epoch) if self._finished else self._position()

    def _steps_from(self, state: PlanState) -> int:
        total, world_size = self._total, self.topology.world_size
        if self.mixture is not None:  # a mixture's epoch is first rounded down to the global batch
            total = delivered_epoch(self.mixture, config=self.plan_config, world_size=world_size, state=state).total
        return int(steps_of_total(total, config=self.plan_config, world_size=world_size, state=state))

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
        self._state, self._delivered, self._finished = start, 0, False
        steps = self._steps_from(start)
        self._token += 1
        head = self._first.head(start) if self._first is not None and steps > 0 else 0
        self._sampler.start(self._token, start, steps, head)
        self._active_steps = steps
        if self.uses_threads:
            if self._threads is None:
                c = self.config
                self._threads = ReaderThreads(self._worker_job(), num_workers=c.num_workers,
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
        batches: Iterator[Any] = iter(dataloader)
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
            if self.config.num_workers == 0 and self._dataloader is not None:
                self._dataloader.dataset.close()  # in-process streams: stop their prefetch threads

    def _get_dataloader(self) -> torch.utils.data.DataLoader:
        if self._dataloader is None:
            workers = self.config.num_workers
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
        c = self.config
        decode_config = self._decode_config()
        return WorkerJob(
            store=self.store, manifest=self.manifest, plan_config=self.plan_config, topology=self.topology,
            batch_size=c.batch_size,
            fields=self.read_fields, verify_index=c.verify_index, decode=c.decode, decode_config=decode_config,
            verify_checksums=c.verify_checksums,
            image_fields=self.image_fields, transform=c.transform, collate=c.collate, on_corrupt=c.on_corrupt,
            prefetch_bytes=c.prefetch_bytes, max_in_flight=c.max_in_flight, cache_dir=c.cache_dir,
            cache_limit_bytes=c.cache_limit_bytes, slice_bytes=c.shuffle_window_bytes, mixture=self.mixture,
            sources=tuple(zip(self.sources.stores, self.sources.manifests, self._mixed.projections))
            if self.sources else (),
            label_fields=self._mixed.label_fields if self.sources else (), reuse_buffers=c.reuse_buffers,
        )

    def _dali_decoder(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        if self._dali is None:
            from dataio.decode.dali import DaliDecoder

            self._dali = DaliDecoder(
                self._decode_config(), batch_size=self.config.batch_size, seed=self.config.seed,
                num_threads=self.config.dali_threads, prefetch_queue_depth=2,
                on_corrupt=self.config.on_corrupt, url_of=mixed_url_of(self.sources) if self.sources else sample_url_of(self.store, self.manifest),
                image_fields=self.image_fields,
            )
        return self._dali

    # --- Stateful (torch.distributed.checkpoint) -------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What has been delivered so far, in a form any rank of any topology can load."""
        return make_state(self._position(), fingerprint=self.fingerprint, plan_config=self.plan_config,
                          mixture=self.mixture, epoch_complete=self._finished and self._active_steps is None)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a state saved by any rank of any topology; StateError says what does not fit."""
        if self._active_steps is not None:
            raise RuntimeError("load_state_dict during an iteration; call it between epochs")
        state = check_state(state_dict, fingerprint=self.fingerprint, plan_config=self.plan_config,
                            mixture=self.mixture)
        try:
            self._steps_from(state)  # replays the saved progress: refuses positions past the epoch
        except (ValueError, IndexError) as exc:
            raise StateError(f"loader state does not fit this dataset: {exc}") from None
        self._state, self._delivered, self._finished = state, 0, False

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


class _TicketSampler(torch.utils.data.Sampler):
    """Yields the current iteration's tickets in order; lives in the main process only."""

    def __init__(self) -> None:
        self._token, self._plan, self._steps = 0, PlanState(epoch=0), 0
        self._head, self._warm = 0, False
        self.released_below = 0  # batches of this iteration the caller has moved past

    def start(self, token: int, plan: PlanState, steps: int, head: int = 0) -> None:
        """Tickets for an iteration: batches below `head` are made in the main process."""
        self._token, self._plan, self._steps, self._head, self._warm = token, plan, steps, head, False
        self.released_below = 0

    def warm(self, plan: PlanState, head: int, num_workers: int) -> None:
        """One warm ticket per worker (token 0, before any iteration): open the stream, read ahead."""
        self._token, self._plan, self._steps, self._head, self._warm = 0, plan, num_workers, head, True

    def __iter__(self) -> Iterator[Ticket]:
        token, plan, head, warm = self._token, self._plan, self._head, self._warm
        # Lazy: each ticket is made when the DataLoader sends it, with the mark as it is then.
        return (Ticket(token, plan, k, self.released_below, head=head, warm=warm) for k in range(self._steps))

    def __len__(self) -> int:
        return self._steps


def _identity(batch: Any) -> Any:
    return batch

