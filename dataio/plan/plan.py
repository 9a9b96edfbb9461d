"""The sample plan: which samples each (rank, worker) delivers in an epoch, in what order.

A pure function of shard sizes, config, slot and resume state: no I/O, no torch, no environment.
An epoch is built in levels. Level 0 is the shards permuted by (seed, epoch) and concatenated.
Each level is split into world_size equal spans of whole batches (the tail dropped or padded),
each span into num_workers runs of whole batches (worker w owns rank batches k = w mod
num_workers, as torch's DataLoader deals them), and each worker shuffles its run within windows:
the first holds one batch, each next one twice the last, up to shuffle_window positions (plan
version 2; version 1 used full windows from the start), so a worker's first batch waits for one
batch of reads, not a whole window. A resume at a new topology starts a level holding what the one
below had not delivered, kept as pieces (a position range, or the unread part of one shuffled
window) of that level, so one worker's plan costs O(shards + pieces + its own share). A resume
at the topology that saved the state continues that level instead, replaying the uninterrupted
run. Padding (tail="pad") sits at a level's end, repeats real samples and is never carried into
the next level; a dropped tail is, so only the last level's tail goes undelivered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dataio.errors import StateError
from dataio.plan.permute import (
    LevelMap,
    Levels,
    ShardOrder,
    build_levels,
    epoch_shard_key,
    num_batches,
    role_counts,
    window_at,
    window_perm,
)
from dataio.plan.skip import IdsOf, build_levels_skipping
from dataio.plan.types import PLAN_VERSION, PlanConfig, PlanState, Segment, WorkerSlot

# Within a window, samples of one shard separated by at most this many undelivered ones are
# read in one segment (the ones between read and skipped). Only resumes leave such gaps: an
# interrupted shuffled window leaves a scattered remainder. Measured at 1B samples after two
# resumes (benchmarks/results_plan.md): gap 0 gives ~10 samples per read, gap 2 ~25 for ~8%
# more samples read, gap 8 ~100 for ~22% more.
READ_THROUGH_GAP = 2


@dataclass(frozen=True, kw_only=True)
class Window:
    """One shuffle window: what to read, then the ids to deliver from it in order."""

    segments: tuple[Segment, ...]  # read order; may hold a few samples not delivered (gaps)
    sample_ids: np.ndarray  # (m,) int64 global ids, delivery order
    is_pad: np.ndarray  # (m,) bool: padding repeats; their ids lie in `segments` too


@dataclass(frozen=True, kw_only=True)
class WorkerPlan:
    """One worker's batches from the state's position to the epoch's end."""

    num_steps: int  # batches every rank delivers from the state's position on
    batch_numbers: np.ndarray  # (n,) int64 ascending; batch j comes from worker j % num_workers
    windows: tuple[Window, ...]  # their ids, concatenated, are the n batches in order


def shard_offsets(shard_sizes: Sequence[int]) -> np.ndarray:
    """(S+1,) int64 cumulative sizes: global id = offsets[shard] + local index (manifest order)."""
    sizes = as_sizes(shard_sizes)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def as_sizes(shard_sizes: Sequence[int]) -> np.ndarray:
    """(S,) int64 shard sizes, checked: one-dimensional integers >= 0."""
    sizes = np.asarray(shard_sizes)
    if sizes.ndim != 1:
        raise ValueError(f"shard_sizes must be one-dimensional, got shape {sizes.shape}")
    if sizes.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(sizes.dtype, np.integer):
        raise TypeError(f"shard_sizes must be integers, got dtype {sizes.dtype}")
    if (sizes < 0).any():
        raise ValueError(f"shard_sizes must be >= 0, got {int(sizes.min())} at {int(sizes.argmin())}")
    return sizes.astype(np.int64, copy=False)


def _check_version(state: PlanState) -> None:
    if state.plan_version != PLAN_VERSION:
        raise StateError(
            f"plan state saved by plan version {state.plan_version}, this shardify uses "
            f"{PLAN_VERSION}: resume with the shardify that saved it, or start the epoch over")


def num_steps(shard_sizes: Sequence[int], *, config: PlanConfig, world_size: int, state: PlanState) -> int:
    """Batches every rank delivers from the state's position to the epoch end (no per-sample work
    unless the state skips samples)."""
    sizes = as_sizes(shard_sizes)
    ids_of, data_key = _single_ids(sizes, config, state.epoch) if state.skip else (None, None)
    return steps_of_total(int(sizes.sum()), config=config, world_size=world_size, state=state,
                          ids_of=ids_of, data_key=data_key)


def steps_of_total(total: int, *, config: PlanConfig, world_size: int, state: PlanState,
                   ids_of: IdsOf | None = None, data_key: Hashable = None) -> int:
    """num_steps for a level 0 of `total` positions, whatever maps them to samples (ids_of: to
    sample ids, needed when the state skips some; data_key names that map for the filter's cache)."""
    _check_version(state)
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    # Continuing the last level or starting a new one gives the same count (whole global batches
    # are gone either way), so num_workers is not needed.
    levels = _levels(total, state.progress, config, state, ids_of, data_key)
    return num_batches(levels.lengths[-1], int(world_size), config)


def _levels(total: int, progress: tuple, config: PlanConfig, state: PlanState, ids_of: IdsOf | None,
            data_key: Hashable) -> Levels:
    """The epoch's levels up to `progress` (a prefix of state.progress), with the state's skip filters."""
    skip = tuple(s for s in state.skip if s.level <= len(progress))
    if not skip:
        return build_levels(total, progress, config, state.epoch)
    if ids_of is None:
        raise ValueError("this plan state skips samples, but the plan was given no map from positions to ids")
    return build_levels_skipping(total, progress, config, state.epoch, skip, ids_of, data_key)


def _single_ids(sizes: np.ndarray, config: PlanConfig, epoch: int) -> tuple[IdsOf, Hashable]:
    """One dataset's level-0 positions -> ids, and a key naming that map."""
    order = ShardOrder(sizes, epoch_shard_key(config, epoch))
    return order.ids, ("single", hashlib.blake2b(sizes.tobytes(), digest_size=16).hexdigest())


def segments_of(ids: np.ndarray, offsets: np.ndarray, place: np.ndarray) -> tuple[Segment, ...]:
    """Reads covering `ids` (global, any order, repeats allowed): each shard front to back, in
    `place` order of their shards; short gaps are read through (READ_THROUGH_GAP)."""
    uniq = np.sort(ids)
    uniq = uniq[np.concatenate([[True], uniq[1:] != uniq[:-1]])]  # pads (and upsampling) repeat ids
    shard = np.searchsorted(offsets, uniq, side="right") - 1
    # A new read starts at a new shard or after a gap too long to read through.
    cut = np.flatnonzero((np.diff(uniq) > READ_THROUGH_GAP + 1) | (np.diff(shard) != 0)) + 1
    heads = np.concatenate([[0], cut]).astype(np.int64)
    seg_shard = shard[heads]
    seg_start = uniq[heads] - offsets[seg_shard]
    seg_stop = uniq[np.append(cut - 1, len(uniq) - 1)] + 1 - offsets[seg_shard]
    order = np.lexsort((seg_start, place[seg_shard]))
    return tuple(Segment(shard=s, start=a, stop=b) for s, a, b in
                 zip(seg_shard[order].tolist(), seg_start[order].tolist(), seg_stop[order].tolist()))


def plan_worker(shard_sizes: Sequence[int], *, config: PlanConfig, slot: WorkerSlot, state: PlanState) -> WorkerPlan:
    """The windows one worker reads and delivers from the state's position to the epoch end."""
    _check_version(state)
    sizes = as_sizes(shard_sizes)
    order = ShardOrder(sizes, epoch_shard_key(config, state.epoch))

    def make_window(pos0: np.ndarray, is_pad: np.ndarray) -> Window:
        ids = order.ids(pos0)
        return Window(segments=segments_of(ids, order.offsets, order.place), sample_ids=ids, is_pad=is_pad)

    data_key = _single_ids(sizes, config, state.epoch)[1] if state.skip else None
    return plan_positions(int(sizes.sum()), config=config, slot=slot, state=state, make_window=make_window,
                          ids_of=order.ids, data_key=data_key)


def plan_positions(total: int, *, config: PlanConfig, slot: WorkerSlot, state: PlanState,
                   make_window: Callable[[np.ndarray, np.ndarray], Window], ids_of: IdsOf | None = None,
                   data_key: Hashable = None) -> WorkerPlan:
    """One worker's plan over a level 0 of `total` positions. make_window turns a window's level-0
    positions (delivery order, (m,) int64) and padding flags into a Window of sample ids; ids_of
    maps level-0 positions to ids (needed when the state skips samples: plan/skip.py)."""
    _check_version(state)
    W, K, B = slot.world_size, slot.num_workers, config.batch_size
    progress, done = state.progress, 0
    filtered_on_top = bool(state.skip) and state.skip[-1].level == len(progress)  # a fresh level over the filter
    if progress and not filtered_on_top and (progress[-1].world_size, progress[-1].num_workers) == (W, K):
        progress, done = progress[:-1], progress[-1].batches  # continue that level, same order
    levels = _levels(total, progress, config, state, ids_of, data_key)
    level, n = len(levels.lengths) - 1, levels.lengths[-1]
    steps = num_batches(n, W, config)
    if done > steps:
        raise StateError(
            f"plan state says {done} batches were delivered at world_size {W}, but the epoch has "
            f"only {steps}: the state belongs to another dataset, batch size or tail policy; "
            "start the epoch over")
    # A fresh DataLoader hands batch 0 after the state to worker 0, so worker w takes the role
    # of the run that produces absolute batch done + w.
    role = (slot.worker_id + done) % K
    counts = role_counts(steps, K) * B
    run_start = slot.rank * steps * B + int(np.sum(counts[:role]))
    run_stop = run_start + int(counts[role])
    delivered = len(range(role, done, K))
    batch_numbers = np.arange(role + K * delivered, steps, K, dtype=np.int64) - done
    rel, _ = window_at(config, np.int64(delivered * B))
    first_window = run_start + int(rel)
    skip = run_start + delivered * B - first_window
    lmap = LevelMap(levels, config, state.epoch)
    real_pos = lmap.level0(level, np.arange(first_window, max(first_window, min(run_stop, n)), dtype=np.int64))
    windows = []
    for ws, wl in _window_bounds(config, first_window - run_start, run_stop - run_start):
        ws += run_start
        seq = real_pos[ws - first_window: ws - first_window + max(0, min(wl, n - ws))]
        pos = np.concatenate([seq, _pad_positions(lmap, level, n, ws, wl, seq)])
        perm = window_perm(config, state.epoch, level, ws, wl)[skip if ws == first_window else 0:]
        if len(perm) == 0:  # the worker's last window was delivered completely
            continue
        windows.append(make_window(pos[perm], perm >= len(seq)))
    return WorkerPlan(num_steps=steps - done, batch_numbers=batch_numbers, windows=tuple(windows))


def _window_bounds(config: PlanConfig, first: int, run_length: int) -> Iterator[tuple[int, int]]:
    """(start, size) run-relative of the windows from the one starting at `first` to the run's end:
    growing ones first (permute.growing_starts), then shuffle_window each; the last cut short."""
    start = first
    while start < run_length:
        _, size = window_at(config, np.int64(start))
        size = min(int(size), run_length - start)
        yield start, size
        start += size


def _pad_positions(lmap: LevelMap, level: int, n: int, ws: int, wl: int, seq: np.ndarray) -> np.ndarray:
    """Level-0 positions repeated at a window's padding: its own samples, or the level's first ones."""
    num_pad = wl - len(seq)
    if num_pad == 0:
        return np.zeros(0, dtype=np.int64)
    if len(seq):  # no extra read: repeat this window's samples
        return seq[np.arange(num_pad) % len(seq)]
    pad_pos = np.arange(ws, ws + wl, dtype=np.int64)
    return lmap.level0(level, (pad_pos - n) % n)
