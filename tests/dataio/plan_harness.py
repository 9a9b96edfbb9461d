"""The sample plan under test, every rank and worker in one process: hypothesis strategies for
shard sizes and configs, one epoch planned for every (rank, worker) with the interface's promises
checked, and the plan's `deliver` / `advance` for the resume harness (resume_harness.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from hypothesis import strategies as st

from dataio.plan.plan import (
    READ_THROUGH_GAP,
    WorkerPlan,
    num_steps,
    plan_worker,
    shard_offsets,
)
from dataio.plan.types import PlanConfig, PlanState, WorkerSlot
from tests.dataio.resume_harness import Topology

Batch = tuple[tuple[int, ...], tuple[bool, ...]]  # (sample ids, is_pad), comparable with ==

# Shard sizes lean on the corner cases: empty and one-sample shards, and a few large ones.
shard_size = st.one_of(st.sampled_from([0, 1]), st.integers(0, 12), st.integers(13, 120))
shard_sizes = st.lists(shard_size, min_size=0, max_size=24)
world_sizes = st.one_of(st.integers(1, 4), st.sampled_from([7, 16, 64]))


@st.composite
def configs(draw: st.DrawFn) -> PlanConfig:
    return PlanConfig(seed=draw(st.integers(0, 2**64 - 1)), batch_size=draw(st.integers(1, 16)),
                      tail=draw(st.sampled_from(["drop", "pad"])), shuffle=draw(st.booleans()),
                      shuffle_window=draw(st.one_of(st.sampled_from([1, 4096]), st.integers(2, 40))))


def plan_deliver(sizes: Sequence[int], config: PlanConfig) -> Callable[[PlanState, Topology], list[list[Batch]]]:
    """`deliver` for the sample plan: every (rank, worker) planned, interleaved as torch does."""
    return lambda state, topology: plan_epoch(sizes, config, world_size=topology[0],
                                              num_workers=topology[1], state=state)


def plan_advance(state: PlanState, topology: Topology, batches: int) -> PlanState:
    """`advance` for the sample plan, through a to_dict/from_dict round trip as a checkpoint does."""
    nxt = state.advanced(world_size=topology[0], num_workers=topology[1], batches=batches)
    return PlanState.from_dict(nxt.to_dict())


def real_ids(batch: Batch) -> list[int]:
    """`real_keys` for plan batches: the ids not flagged as padding."""
    return [i for i, pad in zip(*batch) if not pad]


def plan_epoch(sizes: Sequence[int], config: PlanConfig, *, world_size: int, num_workers: int,
               state: PlanState) -> list[list[Batch]]:
    """Per rank, its batches from the state's position on; each worker plan checked on the way."""
    expected_steps = num_steps(sizes, config=config, world_size=world_size, state=state)
    per_rank = []
    for rank in range(world_size):
        by_number: dict[int, Batch] = {}
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            plan = plan_worker(sizes, config=config, slot=slot, state=state)
            check_worker_plan(plan, sizes=sizes, config=config, slot=slot)
            assert plan.num_steps == expected_steps, (plan.num_steps, expected_steps)
            by_number.update(worker_batches(plan, config.batch_size))
        assert sorted(by_number) == list(range(expected_steps))
        per_rank.append([by_number[j] for j in range(expected_steps)])
    return per_rank


def worker_batches(plan: WorkerPlan, batch_size: int) -> dict[int, Batch]:
    """The worker's batches keyed by rank-level batch number."""
    if not plan.windows:
        return {}
    ids = np.concatenate([w.sample_ids for w in plan.windows]).tolist()
    pads = np.concatenate([w.is_pad for w in plan.windows]).tolist()
    return {int(j): (tuple(ids[i * batch_size:(i + 1) * batch_size]),
                     tuple(pads[i * batch_size:(i + 1) * batch_size]))
            for i, j in enumerate(plan.batch_numbers)}


def check_worker_plan(plan: WorkerPlan, *, sizes: Sequence[int], config: PlanConfig, slot: WorkerSlot) -> None:
    """The interface's promises for one worker: round-robin batches, ids inside sorted segments."""
    expected = np.arange(slot.worker_id, plan.num_steps, slot.num_workers)
    assert np.array_equal(plan.batch_numbers, expected), (plan.batch_numbers, expected)
    assert sum(len(w.sample_ids) for w in plan.windows) == len(expected) * config.batch_size
    offsets = shard_offsets(sizes)
    for window in plan.windows:
        assert window.sample_ids.dtype == np.int64 and window.is_pad.dtype == bool
        assert window.sample_ids.shape == window.is_pad.shape
        covered = set()
        last_stop: dict[int, int] = {}
        for seg in window.segments:
            assert 0 <= seg.start < seg.stop <= sizes[seg.shard], seg
            assert seg.start >= last_stop.get(seg.shard, 0), "segments not front to back"
            last_stop[seg.shard] = seg.stop
            covered.update(range(offsets[seg.shard] + seg.start, offsets[seg.shard] + seg.stop))
        delivered = set(window.sample_ids.tolist())
        assert covered >= delivered
        # Reads are nearly exact: a segment starts and ends on delivered samples and reads
        # through short gaps only.
        for seg in window.segments:
            first, last = offsets[seg.shard] + seg.start, offsets[seg.shard] + seg.stop - 1
            assert first in delivered and last in delivered, seg
        assert len(covered) - len(delivered) <= READ_THROUGH_GAP * max(0, len(window.segments) and len(delivered))


def segment_totals(sizes: Sequence[int], config: PlanConfig, *, world_size: int, num_workers: int,
                   state: PlanState) -> tuple[int, int, int]:
    """(samples read, segments, windows) summed over every worker of every rank."""
    read = segments = windows = 0
    for rank in range(world_size):
        for worker_id in range(num_workers):
            slot = WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
            plan = plan_worker(sizes, config=config, slot=slot, state=state)
            windows += len(plan.windows)
            segments += sum(len(w.segments) for w in plan.windows)
            read += sum(s.stop - s.start for w in plan.windows for s in w.segments)
    return read, segments, windows
