"""The plan's vocabulary: where a worker sits (WorkerSlot), what fixes an epoch's order
(PlanConfig), how far an epoch got (Progress, PlanState) and what a reader is asked for (Segment).

Frozen, validated values with no behaviour beyond their own checks: the plan, the loader and the
readers all speak them, so they live here, below every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dataio.errors import StateError

# 2: a worker's shuffle windows start at one batch and double up to shuffle_window (1: full
# windows from the start). The sample order differs, so a version-1 state is refused, not replayed.
PLAN_VERSION = 2
_TAILS = ("drop", "pad")
_MAX_U64 = (1 << 64) - 1


def _int_field(obj: object, name: str, minimum: int, maximum: int = _MAX_U64) -> None:
    """Check obj.name is an int in [minimum, maximum]; numpy ints are stored as Python ints."""
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{type(obj).__name__}.{name} must be an int, got {value!r}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{type(obj).__name__}.{name} must be in [{minimum}, {maximum}], got {value}")
    object.__setattr__(obj, name, int(value))


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSlot:
    """Where one loader worker sits in the job; built by the caller, never detected here."""

    rank: int
    world_size: int
    worker_id: int
    num_workers: int

    def __post_init__(self) -> None:
        _int_field(self, "world_size", 1)
        _int_field(self, "num_workers", 1)
        _int_field(self, "rank", 0, self.world_size - 1)
        _int_field(self, "worker_id", 0, self.num_workers - 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """Where one loader sits in the job: its rank of world_size, and the plan workers splitting its
    batches (the loader's num_workers, at least 1: an in-process loader plans as one worker).

    Built once at the top (make_loader) and passed down; nothing below reads torch.distributed.
    """

    rank: int
    world_size: int
    num_workers: int

    def __post_init__(self) -> None:
        _int_field(self, "world_size", 1)
        _int_field(self, "num_workers", 1)
        _int_field(self, "rank", 0, self.world_size - 1)

    def slot(self, worker_id: int) -> WorkerSlot:
        """The WorkerSlot of plan worker `worker_id` on this rank."""
        return WorkerSlot(rank=self.rank, world_size=self.world_size, worker_id=worker_id,
                          num_workers=self.num_workers)

    def worker_of(self, batch_number: int) -> int:
        """The plan worker that produces rank-level batch `batch_number` (round robin, as torch hands out)."""
        return batch_number % self.num_workers


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanConfig:
    """What fixes an epoch's order besides the topology: seed, per-rank batch size, tail, shuffle."""

    seed: int
    batch_size: int
    tail: str = "drop"
    shuffle: bool = True
    shuffle_window: int = 4096

    def __post_init__(self) -> None:
        _int_field(self, "seed", 0)
        _int_field(self, "batch_size", 1)
        _int_field(self, "shuffle_window", 1)
        if self.tail not in _TAILS:
            raise ValueError(f"PlanConfig.tail must be one of {_TAILS}, got {self.tail!r}")
        if not isinstance(self.shuffle, bool):
            raise TypeError(f"PlanConfig.shuffle must be a bool, got {self.shuffle!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Batches delivered per rank (all ranks alike) while the job ran at one topology."""

    world_size: int
    num_workers: int
    batches: int

    def __post_init__(self) -> None:
        _int_field(self, "world_size", 1)
        _int_field(self, "num_workers", 1)
        _int_field(self, "batches", 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Skip:
    """Sample ids [a, b) dropped from an epoch, applied after its first `level` progress entries:
    the level they leave is filtered before the next topology splits it (plan/skip.py)."""

    level: int
    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        _int_field(self, "level", 0)
        ranges = tuple((int(a), int(b)) for a, b in self.ranges)
        if any(not 0 <= a < b for a, b in ranges) or any(b >= c for (_, b), (c, _) in zip(ranges, ranges[1:])):
            raise ValueError(f"Skip.ranges must be sorted, disjoint, non-adjacent [a, b) with 0 <= a < b, got {ranges}")
        object.__setattr__(self, "ranges", ranges)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanState:
    """Where an epoch stands: the epoch and the batches delivered at each topology since its start,
    and the samples skipped from it (none: the state and its dict are those of plan version 2 as before)."""

    epoch: int
    progress: tuple[Progress, ...] = ()
    plan_version: int = PLAN_VERSION
    skip: tuple[Skip, ...] = ()  # by level, ascending; later epochs keep them all at level 0

    def __post_init__(self) -> None:
        _int_field(self, "epoch", 0)
        _int_field(self, "plan_version", 0)
        progress = tuple(self.progress)
        for item in progress:
            if not isinstance(item, Progress):
                raise TypeError(f"PlanState.progress holds Progress items, got {item!r}")
        object.__setattr__(self, "progress", progress)
        skip = tuple(self.skip)
        if any(not isinstance(s, Skip) or s.level > len(progress) for s in skip) or \
                [s.level for s in skip] != sorted({s.level for s in skip}):
            raise ValueError(f"PlanState.skip holds Skip items at distinct ascending levels <= {len(progress)}, "
                             f"got {skip!r}")
        object.__setattr__(self, "skip", skip)

    def advanced(self, *, world_size: int, num_workers: int, batches: int) -> PlanState:
        """The state after `batches` more delivered batches at this topology."""
        step = Progress(world_size=world_size, num_workers=num_workers, batches=batches)
        if step.batches == 0:
            return self
        progress = self.progress
        last = progress[-1] if progress else None
        filtered = bool(self.skip) and self.skip[-1].level == len(progress)  # a filter on top: a new level
        if last is not None and not filtered and (last.world_size, last.num_workers) == (world_size, num_workers):
            # Same topology: one level, so a same-topology resume replays the uninterrupted run.
            merged = Progress(world_size=world_size, num_workers=num_workers,
                              batches=last.batches + step.batches)
            progress = progress[:-1] + (merged,)
        else:
            progress = progress + (step,)
        return PlanState(epoch=self.epoch, progress=progress, plan_version=self.plan_version, skip=self.skip)

    def skipped_ids(self) -> tuple[tuple[int, int], ...]:
        """Every id range this state skips, merged (what a later epoch drops from its start)."""
        return merge_ranges([r for s in self.skip for r in s.ranges])

    def next_epoch(self, epoch: int) -> PlanState:
        """The start of `epoch`, keeping every skipped id (one filter at level 0)."""
        ranges = self.skipped_ids()
        return PlanState(epoch=epoch, plan_version=self.plan_version,
                         skip=(Skip(level=0, ranges=ranges),) if ranges else ())

    def skipping(self, ranges: Sequence[tuple[int, int]]) -> PlanState:
        """This state with the id ranges [a, b) dropped from here on (added to any filter at this level)."""
        level = len(self.progress)
        skip = list(self.skip)
        if skip and skip[-1].level == level:
            ranges = [*skip.pop().ranges, *ranges]
        merged = merge_ranges(ranges)
        if merged:
            skip.append(Skip(level=level, ranges=merged))
        return PlanState(epoch=self.epoch, progress=self.progress, plan_version=self.plan_version, skip=tuple(skip))

    def to_dict(self) -> dict:
        """A JSON-able dict that from_dict reads back ("skip" only when some samples are skipped)."""
        d = {
            "plan_version": self.plan_version,
            "epoch": self.epoch,
            "progress": [
                {"world_size": p.world_size, "num_workers": p.num_workers, "batches": p.batches}
                for p in self.progress
            ],
        }
        if self.skip:
            d["skip"] = [{"level": s.level, "ids": [list(r) for r in s.ranges]} for s in self.skip]
        return d

    @classmethod
    def from_dict(cls, d: object) -> PlanState:
        """Read a to_dict() result; StateError on malformed input or another plan version."""
        if not isinstance(d, Mapping):
            raise StateError(f"malformed plan state: expected a dict from PlanState.to_dict, got {d!r}")
        version = d.get("plan_version")
        if version != PLAN_VERSION or type(version) is not int:
            raise StateError(
                f"plan state saved by plan version {version!r}, this shardify uses {PLAN_VERSION}: "
                "resume with the shardify that saved it, or start the epoch over")
        _check_keys(d, {"plan_version", "epoch", "progress"} | ({"skip"} if "skip" in d else set()), "plan state")
        items = d["progress"]
        if not isinstance(items, list | tuple):
            raise StateError(f"malformed plan state: progress must be a list, got {items!r}")
        try:
            progress = []
            for item in items:
                if not isinstance(item, Mapping):
                    raise TypeError(f"progress items must be dicts, got {item!r}")
                _check_keys(item, {"world_size", "num_workers", "batches"}, "plan state progress")
                progress.append(Progress(**item))
            skip = tuple(Skip(level=s["level"], ranges=tuple(map(tuple, s["ids"]))) for s in d.get("skip", ()))
            return cls(epoch=d["epoch"], progress=tuple(progress), plan_version=version, skip=skip)
        except (TypeError, ValueError, KeyError) as exc:
            raise StateError(f"malformed plan state {dict(d)!r}: {exc}; start the epoch over") from exc


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint, non-adjacent [a, b) ranges covering the given ones (empty ones dropped)."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def _check_keys(d: Mapping, expected: set[str], what: str) -> None:
    if set(d) != expected:
        raise StateError(f"malformed {what}: keys {sorted(map(str, d))}, expected {sorted(expected)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """Samples [start, stop) of manifest shard number `shard`, read front to back."""

    shard: int
    start: int
    stop: int
