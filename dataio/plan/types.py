"""The plan's vocabulary: where a worker sits (WorkerSlot), what fixes an epoch's order
(PlanConfig), how far an epoch got (Progress, PlanState) and what a reader is asked for (Segment).

Frozen, validated values with no behaviour beyond their own checks: the plan, the loader and the
readers all speak them, so they live here, below every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
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
class PlanState:
    """Where an epoch stands: the epoch and the batches delivered at each topology since its start."""

    epoch: int
    progress: tuple[Progress, ...] = ()
    plan_version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        _int_field(self, "epoch", 0)
        _int_field(self, "plan_version", 0)
        progress = tuple(self.progress)
        for item in progress:
            if not isinstance(item, Progress):
                raise TypeError(f"PlanState.progress holds Progress items, got {item!r}")
        object.__setattr__(self, "progress", progress)

    def advanced(self, *, world_size: int, num_workers: int, batches: int) -> PlanState:
        """The state after `batches` more delivered batches at this topology."""
        step = Progress(world_size=world_size, num_workers=num_workers, batches=batches)
        if step.batches == 0:
            return self
        progress = self.progress
        last = progress[-1] if progress else None
        if last is not None and (last.world_size, last.num_workers) == (world_size, num_workers):
            # Same topology: one level, so a same-topology resume replays the uninterrupted run.
            merged = Progress(world_size=world_size, num_workers=num_workers,
                              batches=last.batches + step.batches)
            progress = progress[:-1] + (merged,)
        else:
            progress = progress + (step,)
        return PlanState(epoch=self.epoch, progress=progress, plan_version=self.plan_version)

    def to_dict(self) -> dict:
        """A JSON-able dict that from_dict reads back."""
        return {
            "plan_version": self.plan_version,
            "epoch": self.epoch,
            "progress": [
                {"world_size": p.world_size, "num_workers": p.num_workers, "batches": p.batches}
                for p in self.progress
            ],
        }

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
        _check_keys(d, {"plan_version", "epoch", "progress"}, "plan state")
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
            return cls(epoch=d["epoch"], progress=tuple(progress), plan_version=version)
        except (TypeError, ValueError) as exc:
            raise StateError(f"malformed plan state {dict(d)!r}: {exc}; start the epoch over") from exc


def _check_keys(d: Mapping, expected: set[str], what: str) -> None:
    if set(d) != expected:
        raise StateError(f"malformed {what}: keys {sorted(map(str, d))}, expected {sorted(expected)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """Samples [start, stop) of manifest shard number `shard`, read front to back."""

    shard: int
    start: int
    stop: int
