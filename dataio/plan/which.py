"""Which samples an optimizer step delivered: pure arithmetic over the plan and a run's history.

A run's history (loader/history.py keeps it in the loader state) is a list of passes, one per
iteration over an epoch: the epoch, the dataset and plan config it read, and its runs (batches
delivered per rank at one topology with one grad_accum). Step N of the run is the N-th optimizer
step over those runs (a run gives batches // grad_accum of them); its micro-batches are
rank-level batches of one plan level, and a batch's sample ids are the plan's, replayed. No I/O,
no torch: nothing is logged during training, everything is computed after the fact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataio.plan.mix import Mixture, MixState, MixWindow, plan_mix_worker
from dataio.plan.plan import plan_worker, shard_offsets
from dataio.plan.types import PlanConfig, PlanState, Progress, Skip, WorkerSlot


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryRun:
    """Batches every rank received while the job ran at one topology with one grad_accum."""

    world_size: int
    num_workers: int
    batches: int
    grad_accum: int


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryPass:
    """One iteration over an epoch: what it read (fingerprint, plan) and its runs, in order."""

    epoch: int
    fingerprint: str
    plan: PlanConfig
    runs: tuple[HistoryRun, ...]
    skip: tuple[Skip, ...] = ()  # the samples this pass skipped, as its PlanState held them (plan/skip.py)


def replay_runs(p: HistoryPass, runs: tuple[HistoryRun, ...] | None = None) -> PlanState:
    """The PlanState after `runs` (default: all of the pass's), its skip filters where they applied."""
    state = PlanState(epoch=p.epoch)
    for r in p.runs if runs is None else runs:
        state = with_skips(state, p.skip)
        state = state.advanced(world_size=r.world_size, num_workers=r.num_workers, batches=r.batches)
    return with_skips(state, p.skip)


def with_skips(state: PlanState, skip: tuple[Skip, ...]) -> PlanState:
    """`state` with the filters of `skip` that apply at its level (len(progress)) added."""
    for s in skip:
        if s.level == len(state.progress) and s not in state.skip:
            state = PlanState(epoch=state.epoch, progress=state.progress, plan_version=state.plan_version,
                              skip=state.skip + (s,))
    return state


@dataclass(frozen=True, kw_only=True, slots=True)
class StepPlace:
    """Where optimizer step `step` ran: its pass, the epoch's levels before its own, its topology
    and the rank-level batch numbers (within its level) of its micro-batches."""

    step: int
    pass_index: int
    before: tuple[Progress, ...]
    world_size: int
    num_workers: int
    batches: tuple[int, ...]
    skip: tuple[Skip, ...] = ()  # the filters below the step's level


def history_steps(passes: tuple[HistoryPass, ...]) -> int:
    """Optimizer steps the history holds (whole steps of every run)."""
    return sum(r.batches // r.grad_accum for p in passes for r in p.runs)


def locate_step(passes: tuple[HistoryPass, ...], step: int, *, last_step: int) -> StepPlace:
    """The place of optimizer step `step` (1-based); `last_step` is the run's step after the
    history's last run (the checkpoint's step). ValueError when the history does not reach it."""
    first = last_step - history_steps(passes) + 1
    if step < 1:
        raise ValueError(f"step {step} is not an optimizer step: they count from 1 (the first); ask for "
                         f"one of {max(first, 1)}..{last_step}")
    if not first <= step <= last_step:
        raise ValueError(f"step {step} is outside the steps this state's history covers ({first}..{last_step}); "
                         + ("ask a later checkpoint for later steps" if step > last_step else
                            "earlier steps ran before the history began (a state saved by an older shardify)"))
    k = step - first
    for index, p in enumerate(passes):
        state = PlanState(epoch=p.epoch)
        for r in p.runs:
            state = with_skips(state, p.skip)
            n = r.batches // r.grad_accum
            last = state.progress[-1] if state.progress else None
            filtered = bool(state.skip) and state.skip[-1].level == len(state.progress)
            same = last is not None and not filtered and (last.world_size, last.num_workers) == (
                r.world_size, r.num_workers)
            before, done = (state.progress[:-1], last.batches) if same else (state.progress, 0)
            if k < n:
                start = done + k * r.grad_accum
                return StepPlace(step=step, pass_index=index, before=before, world_size=r.world_size,
                                 num_workers=r.num_workers, batches=tuple(range(start, start + r.grad_accum)),
                                 skip=tuple(s for s in state.skip if s.level <= len(before)))
            k -= n
            state = state.advanced(world_size=r.world_size, num_workers=r.num_workers, batches=r.batches)
    raise AssertionError("unreachable: k < history_steps")


@dataclass(frozen=True, kw_only=True)
class BatchIds:
    """One rank-level batch: global sample ids in delivery order, padding flags, sources (mixtures)."""

    ids: np.ndarray  # (B,) int64
    is_pad: np.ndarray  # (B,) bool
    source: np.ndarray | None  # (B,) int64 source index (mixtures), None for one dataset


def batch_ids(data: Mixture | np.ndarray, *, config: PlanConfig, epoch: int, before: tuple[Progress, ...],
              world_size: int, num_workers: int, rank: int, batch: int, skip: tuple[Skip, ...] = ()) -> BatchIds:
    """Rank `rank`'s batch number `batch` of the level after `before` at (world_size, num_workers):
    the plan of the worker that makes it (worker 0 of a loader resumed just before it), first batch."""
    progress = before + (Progress(world_size=world_size, num_workers=num_workers, batches=batch),)
    state = PlanState(epoch=epoch, progress=progress, skip=skip)
    slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=0, num_workers=num_workers)
    if isinstance(data, Mixture):
        plan = plan_mix_worker(data, config=config, slot=slot,
                               state=MixState(plan=state, mixture=data.describe()))
    else:
        plan = plan_worker(data, config=config, slot=slot, state=state)
    B = config.batch_size
    ids, pads, sources, have = [], [], [], 0
    for window in plan.windows:  # the first window usually holds the whole batch
        ids.append(window.sample_ids)
        pads.append(window.is_pad)
        if isinstance(window, MixWindow):
            sources.append(window.source)
        have += len(window.sample_ids)
        if have >= B:
            break
    if have < B:
        raise ValueError(f"batch {batch} at world size {world_size} is past the end of epoch {epoch}")
    return BatchIds(ids=np.concatenate(ids)[:B], is_pad=np.concatenate(pads)[:B],
                    source=np.concatenate(sources)[:B] if sources else None)


def locate_ids(data: Mixture | np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source, shard within the source, position within the shard) of global ids, int64 each."""
    if isinstance(data, Mixture):
        return data.sources_of(ids)
    offsets = shard_offsets(data)
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return np.zeros_like(ids), shard, ids - offsets[shard]
