"""The mixture plan: several datasets blended by weight into one epoch, the five plan properties kept.

A pure function like plan.py (no I/O, no torch). The requested epoch is N positions (epoch_samples;
by default the sum of the sources' sizes); source s owns count_s of them: a `repeat` source
exactly round(repeat x size), the weighted ones the rest by largest remainder of their weights.
When the tail is dropped, the epoch as delivered is N rounded down to a multiple of the global
batch of the topology it starts on, shared again the same way (none above its count_s), so every
source delivers exactly its count. The positions are interleaved smoothly with random access
(interleave.py: a tree of Sturmian splits where its bound on any prefix's deviation from the
shares is below 1, else deadlines.py, below 1 for any number of sources). Source s's k-th
position in epoch e takes draw c = e * count_s + k of an endless sequence of passes: pass
c // size is the source's shards permuted by (seed, source, pass) and concatenated, read at
c % size. A source that runs out starts a new permutation (upsampling); one too big goes on
where it stopped in the next epoch (down-sampling); no sample repeats within a pass; the cursors
use the requested counts, so they do not depend on the topology; all of it is arithmetic, so
resume stays arithmetic. Ranks, workers, shuffle windows, tails and resume levels above level 0
are plan.py's own (plan_positions), so the properties carry over. Global ids and shard numbers
are the sources' concatenated: source s's sample i is id_base[s] + i, its shard j is
shard_base[s] + j.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from dataio.errors import StateError
from dataio.plan.interleave import Interleave
from dataio.plan.permute import ShardOrder
from dataio.plan.plan import (
    Window,
    WorkerPlan,
    as_sizes,
    num_steps,
    plan_positions,
    plan_worker,
    segments_of,
    steps_of_total,
)
from dataio.plan.types import PlanConfig, PlanState, WorkerSlot
from dataio.rand import MASK64, key

# 2: interleaving trees chosen by their bound, the epoch rounded down to the global batch;
# 3: past eight sources, the trees improved by a local search;
# 4: where the best tree's bound is 1 or more, the deadline scheme (deadlines.py) instead.
MIX_VERSION = 4
_MIX_KEY = 0x4D4958  # "MIX": keys of source passes never equal the single-source plan's keys


@dataclass(frozen=True, kw_only=True, eq=False)
class MixSource:
    """One dataset in a mixture: its shard sizes, and a weight or a repeat factor (not both)."""

    name: str  # for messages: a redacted URL or a label
    shard_sizes: Sequence[int]
    weight: float | None = None  # share of what repeat sources leave; default 1 when repeat is None
    repeat: float | None = None  # count per epoch = round(repeat x size): 2.0 twice, 0.5 half
    fingerprint: str = ""  # what identifies the data in a saved state (the manifest's fingerprint)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_sizes", as_sizes(self.shard_sizes))
        if self.weight is not None and self.repeat is not None:
            raise ValueError(f"source {self.name}: give a weight or a repeat, not both")
        for what in ("weight", "repeat"):
            value = getattr(self, what)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"source {self.name}: {what} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"source {self.name}: {what} must be >= 0, got {value}")
            object.__setattr__(self, what, float(value))
        if self.weight is None and self.repeat is None:
            object.__setattr__(self, "weight", 1.0)

    @property
    def num_samples(self) -> int:
        return int(self.shard_sizes.sum())


@dataclass(frozen=True, kw_only=True, eq=False)
class MixEpoch:
    """An epoch as delivered: `total` positions (the mixture's, rounded down to a multiple of the
    global batch when the tail is dropped), each source's count of them, and their interleaving."""

    counts: np.ndarray  # (n,) int64 positions per source, summing to total
    total: int
    order: Interleave

    @property
    def max_deviation(self) -> float:
        """Over any prefix of the epoch, no source's count strays further than this from its share
        (count / total) times the prefix length (interleave.py's bound: below 1, except a tree kept
        where the deadline scheme's block would pass 2^20 positions)."""
        return self.order.max_deviation

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, k) of level-0 positions `pos`: the position is source's k-th draw this epoch."""
        return self.order.locate(pos)

    def prefix_counts(self, length: int) -> np.ndarray:
        """(n,) int64: how many of the first `length` level-0 positions each source owns."""
        return self.order.prefix_counts(length)


@dataclass(frozen=True, kw_only=True, eq=False)
class Mixture:
    """Sources and the epoch they blend into; derives each source's count per epoch (`counts`, of
    `total` positions: the requested epoch) and the epoch as delivered for a global batch."""

    sources: tuple[MixSource, ...]
    epoch_samples: int | None = None  # None: the sum of the sources' sizes (repeat sources scaled)
    # Source s's k-th draw of any epoch is its cursor_base[s] + k (a scheduled mixture's segment,
    # plan/schedule.py); None: epoch * counts[s] + k.
    cursor_base: tuple[int, ...] | None = None
    can_add_sources = False  # a scheduled mixture may gain sources on resume (plan/schedule.py)
    counts: np.ndarray = field(init=False)  # (n,) int64 positions per requested epoch, summing to total
    total: int = field(init=False)  # N, the requested epoch's length
    id_base: np.ndarray = field(init=False)  # (n+1,) int64 first global id of each source
    shard_base: np.ndarray = field(init=False)  # (n+1,) int64 first global shard of each source
    shard_starts: np.ndarray = field(init=False)  # (S+1,) int64 first global id of each global shard

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        if not sources or not all(isinstance(s, MixSource) for s in sources):
            raise TypeError(f"Mixture.sources must be a non-empty sequence of MixSource, got {sources!r}")
        object.__setattr__(self, "sources", sources)
        counts = _counts(sources, self.epoch_samples)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "total", int(counts.sum()))
        sizes = [s.num_samples for s in sources]
        object.__setattr__(self, "id_base", np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        shards = [len(s.shard_sizes) for s in sources]
        object.__setattr__(self, "shard_base", np.concatenate([[0], np.cumsum(shards)]).astype(np.int64))
        object.__setattr__(self, "_epochs", {})  # global batch -> MixEpoch
        object.__setattr__(self, "shard_starts", np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64))

    @property
    def single(self) -> bool:
        """A mixture of one: one source, no repeat, its own size as the epoch. Its plan is the
        single-dataset plan (plan_worker, steps_of_total), keys and rounding included."""
        return (len(self.sources) == 1 and self.sources[0].repeat is None
                and self.total == self.sources[0].num_samples)

    def sources_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, shard within that source, position within that shard) of global sample ids,
        int64 [N] each: a batch's "source", "__shard__" and "__position__", by two binary searches."""
        ids = np.asarray(ids, dtype=np.int64)
        offsets = self.shard_starts
        shard = np.searchsorted(offsets, ids, side="right") - 1  # global shard (skips empty ones)
        source = np.searchsorted(self.shard_base, shard, side="right") - 1  # skips shardless sources
        return source, shard - self.shard_base[source], ids - offsets[shard]

    def epoch(self, global_batch: int = 1) -> MixEpoch:
        """The epoch as delivered when it is rounded down to a multiple of `global_batch` (1: not
        rounded): each source's share of it by largest remainder, never above its count in the
        requested epoch (so the sources' cursors, epoch x count, never overlap)."""
        if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) or global_batch < 1:
            raise ValueError(f"global_batch must be an int >= 1, got {global_batch!r}")
        cache = self._epochs  # type: ignore[attr-defined]
        if global_batch not in cache:
            total = self.total - self.total % int(global_batch)
            counts = self.counts if total == self.total else _rounded_counts(self.sources, self.counts, total)
            cache[global_batch] = MixEpoch(counts=counts, total=total, order=Interleave(counts))
        return cache[global_batch]

    @property
    def max_deviation(self) -> float:
        """The requested epoch's bound on the prefix deviation (MixEpoch.max_deviation)."""
        return self.epoch().max_deviation

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, k) of the requested epoch's level-0 positions `pos` (MixEpoch.locate)."""
        return self.epoch().locate(pos)

    def prefix_counts(self, length: int) -> np.ndarray:
        """The requested epoch's MixEpoch.prefix_counts."""
        return self.epoch().prefix_counts(length)

    @property
    def shard_sizes(self) -> np.ndarray:
        """(sum of shards,) int64: every source's shard sizes, concatenated (global shard order)."""
        return np.concatenate([s.shard_sizes for s in self.sources]).astype(np.int64)

    def plan_worker(self, *, config: PlanConfig, slot: WorkerSlot, state: MixState,
                    orders: dict | None = None) -> WorkerPlan:
        """One worker's windows from the state's position (a scheduled mixture plans its segments);
        `orders` caches the sources' pass orders between calls."""
        return _plan_mix_epoch(self, config=config, slot=slot, state=state, orders={} if orders is None else orders)

    def steps_from(self, *, config: PlanConfig, world_size: int, state: PlanState) -> int:
        """Batches every rank delivers from `state` to the epoch's end."""
        if self.single and state.skip:  # the single-dataset plan's own ids (plan_mix_worker plans it so)
            return num_steps(self.sources[0].shard_sizes, config=config, world_size=world_size, state=state)
        delivered = delivered_epoch(self, config=config, world_size=world_size, state=state)
        ids_of = _mix_ids(self, delivered, config, state.epoch, {}) if state.skip else None
        return steps_of_total(delivered.total, config=config, world_size=world_size, state=state, ids_of=ids_of,
                              data_key=self._skip_key(delivered) if state.skip else None)

    def _skip_key(self, delivered: MixEpoch) -> tuple:
        """What names this mixture's map from level-0 positions to ids (plan/skip.py's cache)."""
        return ("mix", json.dumps(self.describe(), sort_keys=True), self.cursor_base, delivered.total)

    def describe(self) -> dict:
        """A JSON-able description a saved state carries, so another mixture can be refused."""
        return {"mix_version": MIX_VERSION, "epoch_samples": self.total, "sources": [
            {"name": s.name, "fingerprint": s.fingerprint, "num_samples": s.num_samples,
             "num_shards": len(s.shard_sizes), "weight": s.weight, "repeat": s.repeat}
            for s in self.sources]}

    def draw_ids(self, source: int, k: np.ndarray, *, config: PlanConfig, epoch: int,
                 cache: dict | None = None) -> np.ndarray:
        """Global ids of source `source`'s draws `k` (int64) in `epoch`: cursor epoch * count + k.
        `cache` keeps each pass's shard order between calls of one plan."""
        cache = {} if cache is None else cache
        src = self.sources[source]
        size = src.num_samples
        cursor = epoch * int(self.counts[source]) if self.cursor_base is None else int(self.cursor_base[source])
        base_pass, base_off = divmod(cursor, size)
        off = base_off + np.asarray(k, dtype=np.int64)
        passes, idx = off // size, off % size
        out = np.empty_like(idx)
        if not config.shuffle or len(src.shard_sizes) <= 1:  # every pass reads alike
            return ShardOrder(src.shard_sizes, None).ids(idx) + self.id_base[source]
        for p in np.unique(passes).tolist():
            sel = passes == p
            pass_key = key(config.seed, _MIX_KEY, source, (base_pass + p) & MASK64)
            if (source, pass_key) not in cache:
                if len(cache) > 64:  # an upsampled source may pass many times: keep memory bounded
                    cache.clear()
                cache[source, pass_key] = ShardOrder(src.shard_sizes, pass_key)
            out[sel] = cache[source, pass_key].ids(idx[sel])
        return out + self.id_base[source]


def _counts(sources: tuple[MixSource, ...], epoch_samples: int | None) -> np.ndarray:
    """Each source's positions per epoch: repeat ones fixed, weighted ones by largest remainder."""
    sizes = [s.num_samples for s in sources]
    fixed = {i: int(Fraction(s.repeat) * sizes[i] + Fraction(1, 2)) for i, s in enumerate(sources)
             if s.repeat is not None}
    if epoch_samples is None:
        total = sum(fixed.values()) + sum(sizes[i] for i, s in enumerate(sources) if s.repeat is None)
    elif isinstance(epoch_samples, bool) or not isinstance(epoch_samples, (int, np.integer)) or epoch_samples < 0:
        raise ValueError(f"epoch_samples must be an int >= 0, got {epoch_samples!r}")
    else:
        total = int(epoch_samples)
    free = total - sum(fixed.values())
    if free < 0:
        raise ValueError(f"epoch_samples {total} is smaller than the repeat sources' {sum(fixed.values())}")
    # Empty sources (and weight 0) own no positions; the others share what the repeat ones leave.
    weighted = [i for i, s in enumerate(sources) if s.repeat is None and sizes[i] > 0 and s.weight > 0]
    counts = np.zeros(len(sources), dtype=np.int64)
    for i, c in fixed.items():
        counts[i] = c if sizes[i] > 0 else 0
        if c and not sizes[i]:
            raise ValueError(f"source {sources[i].name} has no samples to repeat")
    if free and not weighted:
        raise ValueError(f"an epoch of {total} samples leaves {free} to weighted sources, but none "
                         "has samples and a weight > 0")
    for i, c in _largest_remainder(free, {i: Fraction(sources[i].weight) for i in weighted}).items():
        counts[i] = c
    return counts


def _rounded_counts(sources: tuple[MixSource, ...], full: np.ndarray, total: int) -> np.ndarray:
    """Counts of an epoch cut to `total` (<= full.sum()) positions: repeat sources keep theirs and
    the weighted ones share the rest by largest remainder of their weights, none above its full
    count; when the repeat sources alone exceed `total`, they share it by their full counts."""
    repeat = [i for i, s in enumerate(sources) if s.repeat is not None and full[i] > 0]
    weighted = [i for i, s in enumerate(sources) if s.repeat is None and full[i] > 0]
    caps = {i: int(full[i]) for i in repeat + weighted}
    counts = np.zeros(len(sources), dtype=np.int64)
    fixed = sum(caps[i] for i in repeat)
    if fixed <= total:
        counts[repeat] = [caps[i] for i in repeat]
        shares = _largest_remainder(total - fixed, {i: Fraction(sources[i].weight) for i in weighted}, caps)
    else:
        shares = _largest_remainder(total, {i: Fraction(caps[i]) for i in repeat}, caps)
    for i, c in shares.items():
        counts[i] = c
    return counts


def _largest_remainder(amount: int, weights: dict[int, Fraction], caps: dict[int, int] | None = None) -> dict[int, int]:
    """`amount` split by `weights` (> 0): each its quota's floor, the rest one each by largest
    remainder (ties: lower index), skipping any at its cap (caps sum to >= amount)."""
    if not amount:
        return {i: 0 for i in weights}
    whole = sum(weights.values())
    quota = {i: amount * w / whole for i, w in weights.items()}
    out = {i: math.floor(q) for i, q in quota.items()}
    if caps is not None:
        out = {i: min(c, caps[i]) for i, c in out.items()}
    by_remainder = sorted(weights, key=lambda i: (-(quota[i] - math.floor(quota[i])), i))
    left = amount - sum(out.values())
    while left > 0:  # one round unless caps bind (then again, over those still below their cap)
        for i in by_remainder:
            if left and (caps is None or out[i] < caps[i]):
                out[i] += 1
                left -= 1
    return out


@dataclass(frozen=True, kw_only=True)
class MixWindow(Window):
    """A mixture's shuffle window: sample_ids are global (sources concatenated), plus per sample..."""

    source: np.ndarray  # (m,) int64: the source each delivered sample comes from
    draw: np.ndarray  # (m,) int64: its draw number k within that source's count this epoch


@dataclass(frozen=True, kw_only=True)
class MixState:
    """A PlanState plus the description of the mixture that saved it."""

    plan: PlanState
    mixture: Mapping

    @classmethod
    def start(cls, mixture: Mixture, epoch: int) -> MixState:
        """The state at the start of an epoch."""
        return cls(plan=PlanState(epoch=epoch), mixture=mixture.describe())

    def advanced(self, *, world_size: int, num_workers: int, batches: int) -> MixState:
        plan = self.plan.advanced(world_size=world_size, num_workers=num_workers, batches=batches)
        return MixState(plan=plan, mixture=self.mixture)

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "mixture": dict(self.mixture)}

    @classmethod
    def from_dict(cls, d: object) -> MixState:
        """Read a to_dict() result; StateError when malformed."""
        if not isinstance(d, Mapping) or set(d) != {"plan", "mixture"} or not isinstance(d["mixture"], Mapping):
            raise StateError(f"malformed mixture state: expected MixState.to_dict(), got {d!r}")
        return cls(plan=PlanState.from_dict(d["plan"]), mixture=d["mixture"])


def check_mixture(mixture: Mixture, saved: Mapping) -> None:
    """StateError naming the first difference between a saved mixture description and this one."""
    mine = mixture.describe()
    if saved.get("mix_version") != MIX_VERSION:
        raise StateError(f"mixture state saved by mix version {saved.get('mix_version')!r}, this shardify "
                         f"uses {MIX_VERSION}: resume with the shardify that saved it, or start the epoch over")
    theirs = saved.get("sources")
    added = isinstance(theirs, list) and mixture.can_add_sources and 0 < len(theirs) < len(mine["sources"])
    if not isinstance(theirs, list) or (len(theirs) != len(mine["sources"]) and not added):
        names = [s.get("name") for s in theirs] if isinstance(theirs, list) else theirs
        raise StateError(f"cannot resume: the state was saved with sources {names}, this mixture has "
                         f"{[s['name'] for s in mine['sources']]}; use the same sources, in the same order (a "
                         "mixture with a weight schedule may add sources at the end)")
    for i, (a, b) in enumerate(zip(theirs, mine["sources"])):
        same_data = a.get("fingerprint") == b["fingerprint"] and (b["fingerprint"] or a.get("name") == b["name"])
        if not same_data:
            raise StateError(f"cannot resume: source {i} was {a.get('name')!r} (fingerprint "
                             f"{a.get('fingerprint')!r}) when saved, now {b['name']!r} (fingerprint "
                             f"{b['fingerprint']!r}); use the same sources, in the same order")
        for what in ("num_samples", "num_shards", "weight", "repeat"):
            if a.get(what) != b[what]:
                raise StateError(f"cannot resume: source {i} ({b['name']}) had {what} {a.get(what)!r} when "
                                 f"saved, this mixture has {b[what]!r}; use the saved mixture or start afresh")
    if "schedule" in saved and "schedule" not in mine:
        raise StateError("cannot resume: the state was saved by a mixture with a weight schedule, this one has fixed "
                         "weights; pass the same schedule (pieces after the epoch in progress may change)")
    if saved.get("epoch_samples") != mine["epoch_samples"]:
        raise StateError(f"cannot resume: the mixture's epoch had {saved.get('epoch_samples')!r} samples when "
                         f"saved, this one has {mine['epoch_samples']}; pass epoch_samples={saved.get('epoch_samples')!r}"
                         + (" (an added source would otherwise lengthen the epoch, moving every run position)"
                            if added else ""))


def delivered_epoch(mixture: Mixture, *, config: PlanConfig, world_size: int, state: PlanState) -> MixEpoch:
    """The epoch as delivered: with the tail dropped, rounded down to a multiple of the global
    batch of the topology the epoch started on (the state's first, else `world_size`)."""
    if config.tail != "drop" or mixture.single:  # a mixture of one: steps_of_total drops its tail
        return mixture.epoch(1)
    first = state.progress[0].world_size if state.progress else world_size
    return mixture.epoch(int(first) * config.batch_size)


def mix_num_steps(mixture: Mixture, *, config: PlanConfig, world_size: int, state: MixState) -> int:
    """Batches every rank delivers from the state's position to the mixture epoch's end."""
    check_mixture(mixture, state.mixture)
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return mixture.steps_from(config=config, world_size=world_size, state=state.plan)


def plan_mix_worker(mixture: Mixture, *, config: PlanConfig, slot: WorkerSlot, state: MixState) -> WorkerPlan:
    """One worker's windows (MixWindow) from the state's position to the mixture epoch's end."""
    check_mixture(mixture, state.mixture)
    if mixture.single:  # a mixture of one is the single-dataset plan, bit for bit
        return plan_worker(mixture.sources[0].shard_sizes, config=config, slot=slot, state=state.plan)
    return mixture.plan_worker(config=config, slot=slot, state=state)


def _plan_mix_epoch(mixture: Mixture, *, config: PlanConfig, slot: WorkerSlot, state: MixState,
                    orders: dict) -> WorkerPlan:
    """plan_mix_worker of one unscheduled epoch (Mixture.plan_worker)."""
    epoch = state.plan.epoch
    delivered = delivered_epoch(mixture, config=config, world_size=slot.world_size, state=state.plan)
    offsets = np.concatenate([[0], np.cumsum(mixture.shard_sizes)]).astype(np.int64)
    place = np.arange(len(offsets) - 1, dtype=np.int64)  # a window's reads: sources in order, shards too

    def make_window(pos0: np.ndarray, is_pad: np.ndarray) -> Window:
        source, k = delivered.locate(pos0)
        ids = _draws(mixture, source, k, config, epoch, orders)
        return MixWindow(segments=segments_of(ids, offsets, place), sample_ids=ids, is_pad=is_pad,
                         source=source, draw=k)

    skip = bool(state.plan.skip)
    return plan_positions(delivered.total, config=config, slot=slot, state=state.plan, make_window=make_window,
                          ids_of=_mix_ids(mixture, delivered, config, epoch, orders) if skip else None,
                          data_key=mixture._skip_key(delivered) if skip else None)


def _draws(mixture: Mixture, source: np.ndarray, k: np.ndarray, config: PlanConfig, epoch: int,
           orders: dict) -> np.ndarray:
    """Global ids of draws k of sources `source` (int64, same shape) in `epoch`."""
    ids = np.empty_like(k)
    for s in np.unique(source).tolist():
        sel = source == s
        ids[sel] = mixture.draw_ids(s, k[sel], config=config, epoch=epoch, cache=orders)
    return ids


def _mix_ids(mixture: Mixture, delivered: MixEpoch, config: PlanConfig, epoch: int, orders: dict):
    """The map from an epoch's level-0 positions to global ids (for plan/skip.py's filter)."""
    def ids_of(pos0: np.ndarray) -> np.ndarray:
        source, k = delivered.locate(pos0)
        return _draws(mixture, source, k, config, epoch, orders)

    return ids_of
