"""The mixture plan: several datasets blended by weight into one epoch, the five plan properties kept.

A pure function like plan.py (no I/O, no torch). Level 0 of a mixture epoch is N positions
(epoch_samples; by default the sum of the sources' sizes). Source s owns count_s of them: a
`repeat` source exactly round(repeat x size), the weighted ones the rest by largest remainder of
their weights, so the counts add up to N. The positions are interleaved smoothly: a binary tree
over the sources (the two smallest counts merged first, Huffman-like) splits each node's m
positions between children of a and m - a positions by the Sturmian rule
left_count(p) = floor(p * a / m + 1/2), so every child is within 1/2 of its share over any prefix.
Source s's k-th position in epoch e takes draw c = e * count_s + k of an endless sequence of
passes: pass c // size is the source's shards permuted by (seed, source, pass) and concatenated,
read at c % size. A source that runs out starts a new permutation (upsampling); one too big goes
on where it stopped in the next epoch (down-sampling); no sample repeats within a pass; and all
of it is arithmetic, so resume stays arithmetic. Ranks, workers, shuffle windows, tails and
resume levels above level 0 are plan.py's own (plan_positions), so the properties carry over.
Global ids and shard numbers are the sources' concatenated: source s's sample i is
id_base[s] + i, its shard j is shard_base[s] + j.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from dataio.errors import StateError
from dataio.plan.permute import ShardOrder
from dataio.plan.plan import (
    Window,
    WorkerPlan,
    as_sizes,
    plan_positions,
    segments_of,
    steps_of_total,
)
from dataio.plan.types import PlanConfig, PlanState, WorkerSlot
from dataio.rand import MASK64, key

MIX_VERSION = 1
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
class Mixture:
    """Sources and the epoch they blend into; derives each source's count per epoch and the tree."""

    sources: tuple[MixSource, ...]
    epoch_samples: int | None = None  # None: the sum of the sources' sizes (repeat sources scaled)
    counts: np.ndarray = field(init=False)  # (n,) int64 positions per epoch, summing to total
    total: int = field(init=False)  # N, level 0's length
    id_base: np.ndarray = field(init=False)  # (n+1,) int64 first global id of each source
    shard_base: np.ndarray = field(init=False)  # (n+1,) int64 first global shard of each source

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
        object.__setattr__(self, "_tree", _build_tree(counts))

    @property
    def max_deviation(self) -> float:
        """Over any prefix of the epoch, no source's count strays further than this from its
        share (count / total) times the prefix length; below 1 for up to four sources."""
        tree = self._tree  # type: ignore[attr-defined]
        if tree is None or isinstance(tree, int):
            return 0.0
        return _bound(_strip(tree), self.counts)

    @property
    def shard_sizes(self) -> np.ndarray:
        """(sum of shards,) int64: every source's shard sizes, concatenated (global shard order)."""
        return np.concatenate([s.shard_sizes for s in self.sources]).astype(np.int64)

    def describe(self) -> dict:
        """A JSON-able description a saved state carries, so another mixture can be refused."""
        return {"mix_version": MIX_VERSION, "epoch_samples": self.total, "sources": [
            {"name": s.name, "fingerprint": s.fingerprint, "num_samples": s.num_samples,
             "num_shards": len(s.shard_sizes), "weight": s.weight, "repeat": s.repeat}
            for s in self.sources]}

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, k) of level-0 positions `pos`: the position is source's k-th draw this epoch."""
        pos = np.asarray(pos, dtype=np.int64)
        source, k = np.empty_like(pos), np.empty_like(pos)
        _route(self._tree, pos, np.arange(len(pos)), source, k)  # type: ignore[attr-defined]
        return source, k

    def prefix_counts(self, length: int) -> np.ndarray:
        """(n,) int64: how many of the first `length` level-0 positions each source owns."""
        out = np.zeros(len(self.sources), dtype=np.int64)
        _prefix(self._tree, int(length), out)  # type: ignore[attr-defined]
        return out

    def draw_ids(self, source: int, k: np.ndarray, *, config: PlanConfig, epoch: int,
                 cache: dict | None = None) -> np.ndarray:
        """Global ids of source `source`'s draws `k` (int64) in `epoch`: cursor epoch * count + k.
        `cache` keeps each pass's shard order between calls of one plan."""
        cache = {} if cache is None else cache
        src = self.sources[source]
        size = src.num_samples
        base_pass, base_off = divmod(epoch * int(self.counts[source]), size)
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
    if free:
        w = {i: Fraction(sources[i].weight) for i in weighted}
        whole = sum(w.values())
        quota = {i: free * w[i] / whole for i in weighted}
        for i in weighted:
            counts[i] = math.floor(quota[i])
        left = free - sum(int(counts[i]) for i in weighted)
        by_remainder = sorted(weighted, key=lambda i: (-(quota[i] - math.floor(quota[i])), i))
        for i in by_remainder[:left]:
            counts[i] += 1
    return counts


# The interleaving tree: a leaf is a source index; a node is (left, right, a, m): m positions of
# which the left subtree owns a, spread by left_count(p) = floor((2pa + m) / 2m). Each split is
# within 1/2 of its share over any prefix, and a split's error reaches the sources below it scaled
# by their share of that subtree, so source s's deviation over any prefix is at most
# 1/2 * sum(count_s / count_H for every subtree H on its path, the root excluded): below 1 for up
# to four sources (two levels), and the shape is chosen to keep it small for more.
_EXHAUSTIVE_UP_TO = 6  # sources; (2n - 3)!! trees: 945 at 6


def _build_tree(counts: np.ndarray) -> object:
    leaves = [i for i, c in enumerate(counts.tolist()) if c > 0]
    if not leaves:
        return None
    if len(leaves) <= _EXHAUSTIVE_UP_TO:
        shape = min(_shapes(leaves), key=lambda t: _bound(t, counts))  # first of equals: deterministic
    else:
        shape = _huffman(leaves, counts)
    return _with_counts(shape, counts)


def _shapes(items: list[int]):
    """Every binary tree over `items` (unordered, each once), as nested pairs."""
    if len(items) == 1:
        yield items[0]
        return
    first, rest = items[0], items[1:]
    for r in range(len(rest)):
        for chosen in itertools.combinations(rest, r):
            right = [i for i in rest if i not in chosen]
            for left_tree in _shapes([first, *chosen]):
                for right_tree in _shapes(right):
                    yield (left_tree, right_tree)


def _path_sums(shape: object, counts: np.ndarray) -> tuple[int, dict[int, float]]:
    """(subtree count, {source: sum of count_s / count_H over subtrees H from the leaf to here})."""
    if isinstance(shape, int):
        return int(counts[shape]), {shape: 0.0}
    total, sums = 0, {}
    for child in shape:  # type: ignore[union-attr]
        c, below = _path_sums(child, counts)
        total += c
        sums.update({s: v + int(counts[s]) / c for s, v in below.items()})
    return total, sums


def _bound(shape: object, counts: np.ndarray) -> float:
    """The largest prefix deviation the tree allows any source (see above)."""
    return 0.5 * max(_path_sums(shape, counts)[1].values()) if not isinstance(shape, int) else 0.0


def _huffman(leaves: list[int], counts: np.ndarray) -> object:
    heap = [(int(counts[i]), i, i) for i in leaves]
    heapq.heapify(heap)
    tie = len(counts)
    while len(heap) > 1:
        ca, _, a = heapq.heappop(heap)
        cb, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (ca + cb, tie, (b, a)))
        tie += 1
    return heap[0][2]


def _with_counts(shape: object, counts: np.ndarray) -> object:
    if isinstance(shape, int):
        return shape
    left, right = (_with_counts(child, counts) for child in shape)  # type: ignore[union-attr]
    a, b = _subtree_count(left, counts), _subtree_count(right, counts)
    return (left, right, a, a + b)


def _subtree_count(node: object, counts: np.ndarray) -> int:
    return int(counts[node]) if isinstance(node, int) else node[3]  # type: ignore[index]


def _strip(node: object) -> object:
    return node if isinstance(node, int) else (_strip(node[0]), _strip(node[1]))  # type: ignore[index]


def _left_count(p: np.ndarray, a: int, m: int) -> np.ndarray:
    """floor(p * a / m + 1/2) exactly: in int64 while 2 * m * m fits, else in Python ints."""
    if 2 * m * m + m < (1 << 62):
        return (2 * p * a + m) // (2 * m)
    return np.array([(2 * int(x) * a + m) // (2 * m) for x in p.tolist()], dtype=np.int64)


def _route(node: object, pos: np.ndarray, at: np.ndarray, source: np.ndarray, k: np.ndarray) -> None:
    """Write (source, k) of `pos` (positions within node) into source[at], k[at]."""
    if node is None or len(pos) == 0:  # an empty epoch has no positions to route
        return
    if isinstance(node, int):
        source[at], k[at] = node, pos
        return
    left, right, a, m = node  # type: ignore[misc]
    before = _left_count(pos, a, m)
    is_left = _left_count(pos + 1, a, m) > before
    _route(left, before[is_left], at[is_left], source, k)
    _route(right, (pos - before)[~is_left], at[~is_left], source, k)


def _prefix(node: object, length: int, out: np.ndarray) -> None:
    if node is None:
        return
    if isinstance(node, int):
        out[node] += length
        return
    left, right, a, m = node  # type: ignore[misc]
    c = (2 * length * a + m) // (2 * m)
    _prefix(left, c, out)
    _prefix(right, length - c, out)


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
    if not isinstance(theirs, list) or len(theirs) != len(mine["sources"]):
        names = [s.get("name") for s in theirs] if isinstance(theirs, list) else theirs
        raise StateError(f"cannot resume: the state was saved with sources {names}, this mixture has "
                         f"{[s['name'] for s in mine['sources']]}; use the same sources, in the same order")
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
    if saved.get("epoch_samples") != mine["epoch_samples"]:
        raise StateError(f"cannot resume: the mixture's epoch had {saved.get('epoch_samples')!r} samples when "
                         f"saved, this one has {mine['epoch_samples']}; pass the same epoch_samples")


def mix_num_steps(mixture: Mixture, *, config: PlanConfig, world_size: int, state: MixState) -> int:
    """Batches every rank delivers from the state's position to the mixture epoch's end."""
    check_mixture(mixture, state.mixture)
    return steps_of_total(mixture.total, config=config, world_size=world_size, state=state.plan)


def plan_mix_worker(mixture: Mixture, *, config: PlanConfig, slot: WorkerSlot, state: MixState) -> WorkerPlan:
    """One worker's windows (MixWindow) from the state's position to the mixture epoch's end."""
    check_mixture(mixture, state.mixture)
    epoch = state.plan.epoch
    offsets = np.concatenate([[0], np.cumsum(mixture.shard_sizes)]).astype(np.int64)
    place = np.arange(len(offsets) - 1, dtype=np.int64)  # a window's reads: sources in order, shards too

    orders: dict = {}

    def make_window(pos0: np.ndarray, is_pad: np.ndarray) -> Window:
        source, k = mixture.locate(pos0)
        ids = np.empty_like(pos0)
        for s in np.unique(source).tolist():
            sel = source == s
            ids[sel] = mixture.draw_ids(s, k[sel], config=config, epoch=epoch, cache=orders)
        return MixWindow(segments=segments_of(ids, offsets, place), sample_ids=ids, is_pad=is_pad,
                         source=source, draw=k)

    return plan_positions(mixture.total, config=config, slot=slot, state=state.plan, make_window=make_window)
