"""Skipped samples as a filter level: the remaining order of an epoch without the ids a state skips.

A PlanState's Skip(level=L, ranges) sits on top of level L of its epoch (what the first L progress
entries left): the filter level holds level L's positions whose sample ids are not in the ranges,
in order, as plain range pieces (permute.Pieces with window 0), so LevelMap takes them down like
any other level and the next topology splits it like any other. Equal steps and exactly-once are
the plan's own, over a shorter level. A later epoch carries every skipped id at level 0 and so
shrinks by the skipped samples it holds. A mixture filters positions of its epoch, so every draw
of a skipped id goes (an upsampled id has several); a scheduled mixture puts the filter in the
segment in progress and at level 0 of each later segment (schedule.py split_skipping). States
without a skip never come here: their levels are permute.build_levels', bit for bit.

Cost: the filter needs the ids of every position of the level it filters, O(positions) once; the
result is cached per process (keyed by the data, epoch, config, levels below and ranges).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from dataio.plan.permute import Levels, LevelMap, Pieces, split_level
from dataio.plan.types import PlanConfig, Progress, Skip

IdsOf = Callable[[np.ndarray], np.ndarray]  # level-0 positions (int64) -> global sample ids
_CACHE: dict[Hashable, Pieces] = {}
_CACHE_ENTRIES = 8


def in_ranges(ids: np.ndarray, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """(n,) bool: which ids fall in the sorted disjoint [a, b) ranges."""
    if not ranges:
        return np.zeros(len(ids), dtype=bool)
    bounds = np.asarray(ranges, dtype=np.int64)  # (R, 2)
    i = np.searchsorted(bounds[:, 0], ids, side="right") - 1
    return (i >= 0) & (ids < bounds[np.maximum(i, 0), 1])


def ids_to_ranges(ids: Sequence[int] | np.ndarray) -> tuple[tuple[int, int], ...]:
    """Sorted disjoint [a, b) ranges holding exactly the given ids (repeats allowed)."""
    u = np.unique(np.asarray(ids, dtype=np.int64))
    if len(u) == 0:
        return ()
    cut = np.flatnonzero(np.diff(u) > 1) + 1
    heads = np.concatenate([[0], cut])
    tails = np.append(cut - 1, len(u) - 1)
    return tuple((int(a), int(b) + 1) for a, b in zip(u[heads], u[tails]))


def kept_pieces(ids: np.ndarray, ranges: Sequence[tuple[int, int]]) -> Pieces:
    """The filter level over a level whose positions hold `ids`: runs of positions not skipped."""
    keep = ~in_ranges(ids, ranges)
    edges = np.diff(np.concatenate([[0], keep.astype(np.int8), [0]]))
    heads, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # (P,) each
    lens = (stops - heads).astype(np.int64)
    starts = np.zeros(len(heads) + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    zeros = np.zeros(len(heads), dtype=np.int64)
    return Pieces(starts, heads.astype(np.int64), zeros, zeros.copy())


def build_levels_skipping(total: int, progress: Sequence[Progress], config: PlanConfig, epoch: int,
                          skip: Sequence[Skip], ids_of: IdsOf, data_key: Hashable) -> Levels:
    """permute.build_levels with a filter level after progress[:s.level] for each Skip s."""
    levels = Levels(pieces=[], lengths=[total])
    by_level = {s.level: s for s in skip}
    for i in range(len(progress) + 1):
        if i in by_level:
            level = len(levels.lengths) - 1
            key = (data_key, total, epoch, config, tuple(progress[:i]), tuple((s.level, s.ranges) for s in skip if s.level <= i))
            if key not in _CACHE:
                pos0 = LevelMap(levels, config, epoch).level0(level, np.arange(levels.lengths[-1], dtype=np.int64))
                if len(_CACHE) >= _CACHE_ENTRIES:
                    _CACHE.pop(next(iter(_CACHE)))
                _CACHE[key] = kept_pieces(ids_of(pos0), by_level[i].ranges)
            levels.pieces.append(_CACHE[key])
            levels.lengths.append(int(_CACHE[key].starts[-1]))
        if i < len(progress):
            level = len(levels.lengths) - 1
            pieces = split_level(levels.lengths[-1], progress[i], level=level, config=config, epoch=epoch)
            levels.pieces.append(pieces)
            levels.lengths.append(int(pieces.starts[-1]))
    return levels
