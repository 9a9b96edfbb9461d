"""The epoch's order as arithmetic: counter-based permutations, resume levels, positions -> ids.

Permutations are dataio.rand's, keyed by (seed, epoch, level, index): a saved plan state
replays bit for bit after an upgrade. Level t >= 1 of an epoch (see plan.py) is
kept as pieces of level t - 1, so resolving one worker's positions costs O(pieces + its share).
LevelMap takes positions down to level 0; ShardOrder (one dataset) or mix.py's mixture maps
level 0 to sample ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataio.errors import StateError
from dataio.plan.types import PlanConfig, Progress
from dataio.rand import key, permutation


def num_batches(n: int, world_size: int, config: PlanConfig) -> int:
    """Batches per rank for a level of n real samples: the tail dropped or padded."""
    per_step = world_size * config.batch_size
    return n // per_step if config.tail == "drop" else -(-n // per_step)


def role_counts(steps: int, num_workers: int) -> np.ndarray:
    """(K,) int64: len(range(w, steps, K)) for each worker w, its share of `steps` rank batches."""
    w = np.arange(num_workers, dtype=np.int64)
    return np.where(w < steps, (steps - 1 - w) // num_workers + 1, 0)


def growing_starts(config: PlanConfig) -> np.ndarray:
    """(J+1,) int64 run-relative starts of a worker run's growing windows, then where full ones begin.

    A run's first window holds one batch (at most shuffle_window positions), each next one twice
    the last, until a window would reach shuffle_window; from there on every window holds
    shuffle_window. So a worker's first batch waits for one batch of reads, not a whole window,
    and windows reach their full size after about one window's worth of positions.
    """
    win, size = config.shuffle_window, min(config.shuffle_window, config.batch_size)
    starts = [0]
    while size < win:
        starts.append(starts[-1] + size)
        size *= 2
    return np.asarray(starts, dtype=np.int64)


def window_at(config: PlanConfig, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, size) run-relative of the window holding run-relative `offset` (int64, any shape);
    the size is the window's full size (a run's end may cut its last window short)."""
    offset = np.asarray(offset, dtype=np.int64)
    starts, win = growing_starts(config), config.shuffle_window
    full = int(starts[-1])  # where full-size windows begin
    sizes = np.append(np.diff(starts), win)  # (J+1,): the growing sizes, then win
    j = np.searchsorted(starts, offset, side="right") - 1  # (shape,) in [0, J]
    start = np.where(offset < full, starts[j], full + (offset - full) // win * win)
    return start, sizes[j]


def window_perm(config: PlanConfig, epoch: int, level: int, start: int, size: int) -> np.ndarray:
    """The delivery order within the window of `size` positions starting at `start` of a level."""
    if not config.shuffle:
        return np.arange(size, dtype=np.int64)
    return permutation(key(config.seed, epoch, level + 1, start), size)


@dataclass(frozen=True, slots=True)
class Pieces:
    """Level t >= 1 as pieces of level t-1; piece i holds positions [starts[i], starts[i+1])."""

    starts: np.ndarray  # (P+1,) int64
    src: np.ndarray  # (P,) int64: first source position (range) or window start (window tail)
    window: np.ndarray  # (P,) int64: 0 for a range piece, else the window's size
    skip: np.ndarray  # (P,) int64: leading positions of the permuted window already delivered


def split_level(n: int, prog: Progress, *, level: int, config: PlanConfig, epoch: int) -> Pieces:
    """What level `level` (n real samples) had not delivered after prog.batches at prog's topology."""
    W, K, B = prog.world_size, prog.num_workers, config.batch_size
    steps = num_batches(n, W, config)
    if prog.batches > steps:
        raise StateError(
            f"plan state says {prog.batches} batches were delivered at world_size {W}, but that "
            f"stage of the epoch has only {steps}: the state belongs to another dataset, batch "
            "size or tail policy; start the epoch over")
    counts = role_counts(steps, K) * B  # (K,) positions in each worker's run
    first = np.cumsum(counts) - counts  # (K,) where each run starts in its rank's span
    start = (np.arange(W, dtype=np.int64)[:, None] * (steps * B) + first).ravel()  # (W*K,)
    length = np.tile(counts, W)
    done = np.tile(role_counts(prog.batches, K) * B, W)
    rel, size = window_at(config, done)  # the window holding each run's next undelivered position
    ws = start + rel
    wl = np.minimum(size, length - rel)
    skip = done - (ws - start)
    real = np.clip(n - ws, 0, wl)  # positions at or beyond n are padding, never carried over
    tail_len = np.where(skip > 0, np.where(real == wl, wl - skip, 0), 0)
    for i in np.flatnonzero((skip > 0) & (real > 0) & (real < wl)):  # the window straddling n
        perm = window_perm(config, epoch, level, int(ws[i]), int(wl[i]))
        tail_len[i] = np.count_nonzero(perm[skip[i]:] < real[i])
    rest = np.minimum(np.where(skip > 0, ws + wl, ws), n)
    rest_len = np.maximum(np.minimum(start + length, n) - rest, 0)
    # (W*K, 2) -> rank-major, each worker's window tail before the rest of its run.
    src = np.stack([ws, rest], axis=1).ravel()
    window = np.stack([np.where(skip > 0, wl, 0), np.zeros_like(wl)], axis=1).ravel()
    skips = np.stack([skip, np.zeros_like(skip)], axis=1).ravel()
    lens = np.stack([tail_len, rest_len], axis=1).ravel()
    if config.tail == "drop" and n > W * steps * B:  # the dropped tail stays for the next level
        src, window, skips, lens = (np.append(src, W * steps * B), np.append(window, 0),
                                    np.append(skips, 0), np.append(lens, n - W * steps * B))
    keep = lens > 0
    return _merge_ranges(src[keep], window[keep], skips[keep], lens[keep])


def _merge_ranges(src: np.ndarray, window: np.ndarray, skip: np.ndarray, lens: np.ndarray) -> Pieces:
    """Join consecutive range pieces that continue each other (all of them when nothing was read)."""
    is_range = window == 0
    joins = np.zeros(len(src), dtype=bool)
    joins[1:] = is_range[1:] & is_range[:-1] & (src[1:] == src[:-1] + lens[:-1])
    heads = np.flatnonzero(~joins)
    lens = np.add.reduceat(lens, heads) if len(heads) else lens
    starts = np.zeros(len(heads) + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    return Pieces(starts, src[heads], window[heads], skip[heads])


@dataclass(frozen=True, kw_only=True)
class Levels:
    """An epoch's levels below the current one, and each level's number of real samples."""

    pieces: list[Pieces]  # pieces[t - 1] describes level t in terms of level t - 1
    lengths: list[int]  # lengths[t]: real samples in level t


def build_levels(total: int, progress: Sequence[Progress], config: PlanConfig, epoch: int) -> Levels:
    """Level 0 holds `total` samples; each Progress entry splits its level and starts the next."""
    pieces, lengths = [], [total]
    for level, prog in enumerate(progress):
        level_pieces = split_level(lengths[-1], prog, level=level, config=config, epoch=epoch)
        pieces.append(level_pieces)
        lengths.append(int(level_pieces.starts[-1]))
    return Levels(pieces=pieces, lengths=lengths)


class LevelMap:
    """Maps positions of any level down to level 0 (the epoch's sequence before any resume)."""

    def __init__(self, levels: Levels, config: PlanConfig, epoch: int) -> None:
        self.config, self.epoch, self.levels = config, epoch, levels

    def level0(self, level: int, pos: np.ndarray) -> np.ndarray:
        """Level-0 positions of positions `pos` (int64, any order) of `level`."""
        for t in range(level, 0, -1):
            pos = self._down(t, pos)
        return pos

    def _down(self, t: int, pos: np.ndarray) -> np.ndarray:
        pc = self.levels.pieces[t - 1]
        piece = np.searchsorted(pc.starts, pos, side="right") - 1
        off = pos - pc.starts[piece]
        out = pc.src[piece] + off  # right for range pieces; window tails are replaced below
        tails = np.flatnonzero(pc.window[piece] > 0)
        if len(tails):
            order = tails[np.argsort(piece[tails], kind="stable")]
            groups, heads = np.unique(piece[order], return_index=True)
            for g, lo, hi in zip(groups, heads, np.append(heads[1:], len(order))):
                sel = order[lo:hi]
                out[sel] = self._window_tail(t - 1, pc, int(g))[off[sel]]
        return out

    def _window_tail(self, level: int, pc: Pieces, i: int) -> np.ndarray:
        """Positions of `level` still undelivered in piece i's window, in delivery order."""
        ws, wl, skip = int(pc.src[i]), int(pc.window[i]), int(pc.skip[i])
        rest = window_perm(self.config, self.epoch, level, ws, wl)[skip:]
        rest = rest[rest < self.levels.lengths[level] - ws]  # padding is not carried over
        return ws + rest


class ShardOrder:
    """Level 0 of one pass over a dataset: its shards in a keyed order (None: manifest order),
    concatenated; maps positions in that sequence to global sample ids."""

    def __init__(self, sizes: np.ndarray, perm_key: int | None) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # as plan.shard_offsets
        if perm_key is None:
            self.order = np.arange(len(sizes), dtype=np.int64)
        else:
            self.order = permutation(perm_key, len(sizes))
        self.starts = np.zeros(len(sizes) + 1, dtype=np.int64)  # sequence start of each shard
        np.cumsum(sizes[self.order], out=self.starts[1:])
        self.place = np.empty_like(self.order)  # place[shard]: where the shard comes in the sequence
        self.place[self.order] = np.arange(len(sizes), dtype=np.int64)

    def ids(self, pos: np.ndarray) -> np.ndarray:
        """Global ids at sequence positions `pos` (int64, any order)."""
        i = np.searchsorted(self.starts, pos, side="right") - 1  # skips empty shards
        return self.offsets[self.order[i]] + (pos - self.starts[i])


def epoch_shard_key(config: PlanConfig, epoch: int) -> int | None:
    """The key that orders one dataset's shards in an epoch (None when not shuffling)."""
    return key(config.seed, epoch, 0, 0) if config.shuffle else None
