"""The token mixture plan: several token datasets blended into one epoch of sequences, weights as token shares.

A pure function like token_plan.py (no I/O, no torch). Each source's unit is its sequence of seq_len + 1
tokens (token_plan.py cuts it); the mixture plan (mix.py) gives source s an exact count of the epoch's
sequence positions by weight and interleaves them within 1 of the shares over every prefix. Every
sequence carries seq_len tokens of input, so shares of sequences are shares of tokens (under aligned
packing, of sequences with their padding). Source s's k-th position takes draw c = epoch * count_s + k
of an endless run of passes over its sequences: pass p = c // num_sequences_s is the source's level 0
with its shards permuted by (its seed, p); a source that runs out starts a new pass (upsampling), one
too big goes on where it stopped in the next epoch. Ranks, workers, windows, tails and resume are
plan.py's (plan_positions), so the five properties hold in sequences of the mixture. A mixture of one
(Mixture.single: what the loader builds for one dataset) is token_plan.py's plan, bit for bit (its seed, its
cut, its tail), as mix.py's is plan.py's: one path in the loader, and the single dataset's plan unchanged.

A weight Schedule (schedule.py) is the image mixtures' segment design in sequences: pieces of weights
over the run's sequence positions, each epoch cut into segments where pieces start, each segment a
mixture epoch of its own planned under its plan epoch, its draws continuing at the segment's cursor
base (so a source's sequences never repeat within a pass); the ScheduledMixture splits a saved
progress over the segments, so resume lands mid-piece at any topology.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dataio.plan.mix import MixSource, Mixture, delivered_epoch
from dataio.plan.plan import Window, plan_positions
from dataio.plan.schedule import Piece, ScheduledMixture, _plan_epoch, scheduled  # one segment keying for both
from dataio.plan.token_plan import (
    SequenceGroup,
    SequenceOrder,
    TokenPlanConfig,
    TokenWindow,
    TokenWorkerPlan,
    plan_token_worker,
    token_num_steps,
)
from dataio.plan.types import PlanState, Segment, WorkerSlot
from dataio.rand import key

_TOKEN_MIX_KEY = 0x544F4B4D4958  # "TOKMIX": each source's shard permutations its own


@dataclass(frozen=True, kw_only=True)
class TokenMixWindow(TokenWindow):
    """A mixture's window: segments' shards are global (sources' shards concatenated)."""

    source: np.ndarray  # (m,) int64


def source_config(config: TokenPlanConfig, source: int) -> TokenPlanConfig:
    """Source s's own seed for its shard permutations (so equal sources are not permuted alike)."""
    return replace(config, plan=replace(config.plan, seed=key(config.plan.seed, _TOKEN_MIX_KEY, source)))


def token_mixture(doc_lengths: Sequence[Sequence[Sequence[int]]], config: TokenPlanConfig, *,
                  names: Sequence[str], weights: Sequence[float], fingerprints: Sequence[str],
                  schedule: Sequence[Piece] | None = None, epoch_samples: int | None = None) -> Mixture:
    """The mixture of sources (each its shards' document lengths) counted in sequences, weights as shares;
    with `schedule`, weights that follow its pieces (each lasting a number of sequences) over the run;
    `epoch_samples` sequences an epoch (None: the sources' sequences summed)."""
    sources = []
    for s, docs in enumerate(doc_lengths):
        n = SequenceOrder(docs, source_config(config, s), 0).num_sequences  # the same in every pass
        sources.append(MixSource(name=names[s], shard_sizes=[n], weight=float(weights[s]),
                                 fingerprint=fingerprints[s]))
    if schedule is not None:
        return scheduled(sources, schedule, epoch_samples)
    return Mixture(sources=tuple(sources), epoch_samples=epoch_samples)


def token_mix_num_steps(doc_lengths: Sequence[Sequence[Sequence[int]]], mixture: Mixture, *, config: TokenPlanConfig,
                        world_size: int, state: PlanState) -> int:
    """Batches every rank delivers from the state's position to the mixture epoch's end (a schedule's: the
    segments from the state's one on); a mixture of one: the single dataset's (plan/token_plan.py)."""
    if mixture.single:
        return token_num_steps(doc_lengths[0], config=config, world_size=world_size, state=state)
    return int(mixture.steps_from(config=config.plan, world_size=world_size, state=state))


def plan_token_mix_worker(doc_lengths: Sequence[Sequence[Sequence[int]]], mixture: Mixture, *,
                          config: TokenPlanConfig, slot: WorkerSlot, state: PlanState) -> TokenWorkerPlan:
    """One worker's windows of mixed sequences (TokenMixWindow), from the state's position on. A mixture of
    one is the single-dataset plan (plan_token_worker), bit for bit: its seed, its cut and its tail."""
    if mixture.single:
        return plan_token_worker(doc_lengths[0], config=config, slot=slot, state=state)
    orders: dict[tuple[int, int], SequenceOrder] = {}
    if not isinstance(mixture, ScheduledMixture):
        base = state.epoch * mixture.counts  # source s's k-th position of the epoch takes draw base[s] + k
        return _plan_segment(doc_lengths, mixture, config=config, slot=slot, state=state, base=base, orders=orders)
    # A schedule: the segments from the state's one to the epoch's end, concatenated; in a later segment the
    # worker takes the role of the one that makes its batches (round robin goes on), as in ScheduledMixture.
    epoch = state.epoch
    index, seg = mixture.split(state, config.plan)
    windows: list[TokenWindow] = []
    numbers, offset = [], 0
    for j in range(index, len(mixture.segments(epoch))):
        mix = mixture.segment(epoch, j)
        sub = seg if j == index else PlanState(epoch=_plan_epoch(epoch, j))
        worker = slot if j == index else replace(slot, worker_id=(slot.worker_id - offset) % slot.num_workers)
        assert mix.cursor_base is not None
        plan = _plan_segment(doc_lengths, mix, config=config, slot=worker, state=sub,
                             base=np.asarray(mix.cursor_base, dtype=np.int64), orders=orders)
        windows += plan.windows
        numbers.append(plan.batch_numbers + offset)
        offset += plan.num_steps
    return TokenWorkerPlan(num_steps=offset, batch_numbers=np.concatenate(numbers) if numbers else
                           np.zeros(0, dtype=np.int64), windows=tuple(windows), order=None)


def _plan_segment(doc_lengths: Sequence[Sequence[Sequence[int]]], mixture: Mixture, *, config: TokenPlanConfig,
                  slot: WorkerSlot, state: PlanState, base: np.ndarray,
                  orders: dict[tuple[int, int], SequenceOrder]) -> TokenWorkerPlan:
    """One unscheduled mixture epoch (or schedule segment) of the worker; source s's k-th position takes its
    draw base[s] + k."""
    delivered = delivered_epoch(mixture, config=config.plan, world_size=slot.world_size, state=state)
    shard_base = np.concatenate([[0], np.cumsum([len(d) for d in doc_lengths])]).astype(np.int64)
    sizes = np.asarray([s.num_samples for s in mixture.sources], dtype=np.int64)
    windows: list[TokenWindow] = []

    def order_of(source: int, pass_: int) -> SequenceOrder:
        if (source, pass_) not in orders:
            if len(orders) > 64:  # an upsampled source may pass many times: keep memory bounded
                orders.clear()
            orders[source, pass_] = SequenceOrder(doc_lengths[source], source_config(config, source), pass_)
        return orders[source, pass_]

    def make_window(pos0: np.ndarray, is_pad: np.ndarray) -> Window:
        source, k = delivered.locate(pos0)
        draw = base[source] + k
        passes, idx = draw // sizes[source], draw % sizes[source]
        m = len(pos0)
        starts, counts, owned, group = (np.zeros(m, dtype=np.int64) for _ in range(4))
        segments: list[Segment] = []
        groups: list[SequenceGroup] = []
        for s, p in sorted({(int(a), int(b)) for a, b in zip(source, passes)}):
            sel = (source == s) & (passes == p)
            order = order_of(s, p)
            starts[sel], counts[sel], owned[sel] = order.sequences(idx[sel])
            segs = [replace(g, shard=g.shard + int(shard_base[s])) for g in order.segments(starts[sel], counts[sel])]
            group[sel] = len(groups)
            groups.append(SequenceGroup(source=s, order=order, first=len(segments), end=len(segments) + len(segs)))
            segments += segs
        windows.append(TokenMixWindow(segments=tuple(segments), stream_starts=starts, num_tokens=counts,
                                      num_owned=owned, is_pad=is_pad, source=source, group=group,
                                      groups=tuple(groups)))
        return Window(segments=(), sample_ids=pos0, is_pad=is_pad)

    plan = plan_positions(delivered.total, config=config.plan, slot=slot, state=state, make_window=make_window)
    return TokenWorkerPlan(num_steps=plan.num_steps, batch_numbers=plan.batch_numbers, windows=tuple(windows),
                           order=None)
