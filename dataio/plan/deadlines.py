"""An interleaving whose every prefix is within 1 of the shares, for any number of sources.

Source i owns c_i of N positions, share w_i = c_i / N. Its j-th position (j = 1..c_i) must fall in
slots (1-based) [floor((j-1) N / c_i) + 1, ceil(j N / c_i)], its window: then after t slots it owns
floor(w_i t) or ceil(w_i t) positions (all windows ending by t are served, none starting after t),
so |count - w_i t| <= (N-1)/N < 1 over every prefix, and exactly c_i at the end. An interval of
q - p + 1 slots holds at most floor(w_i q) - ceil(w_i (p-1)) <= w_i (q-p+1) whole windows of source
i, at most its length in all, so an assignment exists (Hall; windows are intervals, so intervals of
slots are the sets to check) and earliest-deadline-first (EDF) finds one. EDF is sequential, so
the epoch is cut into blocks of B >= N / min(c) slots and only the block holding a position is
filled, from boundary states chosen without a pass. Proof that every block can be filled:

A state at t says which sources with w_i t not whole are rounded up (the set U, r(t) = t -
sum floor(w_i t) of them). Block [a, b] is fillable iff Hall holds on its prefixes and suffixes
(inner intervals hold at most their length of whole windows, as above) and no count goes down
(every source's window index steps within B >= N / c_i slots), i.e. iff
  P(a): for q in (a, b], the sources of U(a) still in the cell they had at a are <= r(q);
  S(b): for p in [a, b), the sources rounded down at b and in one open cell since p are <= dn(p)
        = sum ceil(w_i p) - p (the number rounded down at p).
P is about the state at a alone, S about the state at b alone. The rounded-down sets meeting S(t)
are the independent sets of a matroid (capacities on a chain of sets: sources by where their
cell began); the greedy basis, taking first the sources whose cell ends last, is Gale-optimal:
for every q it leaves the fewest of U still uncrossed at q. Some whole-epoch EDF assignment passes
through a state at t meeting S(t) and P(t) (its blocks are filled), so the greedy state meets
P(t) too. Hence every block is fillable and EDF fills it, in O(B log n) per block touched.
"""

from __future__ import annotations

import heapq
from fractions import Fraction

import numpy as np

_MIN_BLOCK = 4096  # slots: amortises a boundary's O(n^2) choice over many positions
_CACHE_BLOCKS = 16  # filled blocks kept per order (a worker reads a few consecutive ones)


class DeadlineOrder:
    """The interleaving of `counts` (n,) int64 with every prefix count floor or ceil of its share."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.total = int(self.counts.sum())
        self.block = self.block_for(self.counts)
        self._filled: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._states: dict[int, np.ndarray] = {}  # boundary -> counts (each is two blocks' end)

    @staticmethod
    def block_for(counts: np.ndarray) -> int:
        """Positions per block: at least N / the smallest count (every source's windows step within
        a block), at least _MIN_BLOCK, at most N."""
        counts = np.asarray(counts, dtype=np.int64)
        positive = counts[counts > 0]
        total = int(counts.sum())
        need = -(-total // int(positive.min())) if len(positive) else 1
        return max(1, min(total, max(need, _MIN_BLOCK)))

    @property
    def max_deviation(self) -> float:
        """Every prefix count is floor or ceil of share x length: within (N-1)/N of it."""
        return (self.total - 1) / self.total if self.total else 0.0

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, k) of positions `pos` (int64, any order): the position is source's k-th."""
        pos = np.asarray(pos, dtype=np.int64)
        source, k = np.empty_like(pos), np.empty_like(pos)
        blocks = pos // self.block
        for b in np.unique(blocks).tolist():
            sel = blocks == b
            start, src, rank = self._fill(b)
            at = pos[sel] - b * self.block
            source[sel] = src[at]
            k[sel] = start[src[at]] + rank[at]
        return source, k

    def prefix_counts(self, length: int) -> np.ndarray:
        """(n,) int64: how many of the first `length` positions each source owns."""
        length = int(length)
        b, within = divmod(length, self.block)
        if within == 0 or length >= self.total:
            return self.state(min(length, self.total))
        start, src, _ = self._fill(b)
        return start + np.bincount(src[:within], minlength=len(self.counts))

    def state(self, t: int) -> np.ndarray:
        """(n,) int64 counts after the first t slots, t a block boundary or N (no pass needed)."""
        c, n_total = self.counts, self.total
        if t <= 0 or t >= n_total:
            return np.zeros_like(c) if t <= 0 else c.copy()
        cached = self._states.get(t)  # .get: another thread may clear the cache between two looks
        if cached is not None:
            return cached.copy()
        whole = c * t // n_total if _fits(n_total, t) else np.array([int(x) * t // n_total for x in c.tolist()])
        counts = whole + _rounded_up(c.tolist(), n_total, t, self.block)
        if len(self._states) >= 2 * _CACHE_BLOCKS:
            self._states.clear()
        self._states[t] = counts
        return counts.copy()

    def _fill(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Block b's (counts at its start (n,), source of each slot (L,), rank within its source (L,))."""
        cached = self._filled.get(b)
        if cached is not None:
            return cached
        a = b * self.block
        end = min(a + self.block, self.total)
        start, stop = self.state(a), self.state(end)
        src = _edf(self.counts.tolist(), self.total, a, end, start.tolist(), stop.tolist())
        rank = np.empty_like(src)
        for s in np.unique(src).tolist():
            at = np.flatnonzero(src == s)
            rank[at] = np.arange(len(at))
        if len(self._filled) >= _CACHE_BLOCKS:
            self._filled.clear()
        self._filled[b] = (start, src, rank)
        return start, src, rank


def _fits(total: int, t: int) -> bool:
    return total * max(t, 1) < (1 << 62)


def _rounded_up(c: list[int], total: int, t: int, block: int) -> np.ndarray:
    """(n,) 0/1: which sources are rounded up at boundary t (the module docstring's greedy)."""
    n = len(c)
    out = np.zeros(n, dtype=np.int64)
    frac = [ci * t % total for ci in c]
    cell = [ci * t // total for ci in c]
    open_ = [i for i in range(n) if frac[i]]  # sources with w_i t not whole
    num_up = sum(frac) // total
    num_down = len(open_) - num_up
    if not open_ or num_down == 0:
        out[open_] = 1
        return out
    # The chain: B_p = the sources in one open cell since p, i.e. those with began <= p.
    began = {i: cell[i] * total // c[i] + 1 for i in open_}
    lo = max(0, t - block)
    p = np.arange(lo, t, dtype=np.int64)
    dn = _down_counts(c, total, p)  # dn(p) for every p of the block before t
    cap: dict[int, int] = {}  # the chain set's size -> the smallest dn(p) over p where it applies
    size_at = np.searchsorted(np.array(sorted(began.values())), p, side="right")
    for size in np.unique(size_at).tolist():
        if size:
            cap[size] = int(dn[size_at == size].min())
    need = {i: sum(1 for j in open_ if began[j] <= began[i]) for i in open_}  # in every set >= this size
    used = dict.fromkeys(cap, 0)
    down: list[int] = []
    # Rounded down first: the sources whose cell ends last (ties: the higher index), while S allows.
    for i in sorted(open_, key=lambda i: (-Fraction(cell[i] + 1, c[i]), -i)):
        sizes = [s for s in cap if s >= need[i]]
        if all(used[s] < cap[s] for s in sizes):
            for s in sizes:
                used[s] += 1
            down.append(i)
            if len(down) == num_down:
                break
    assert len(down) == num_down, "a boundary state always exists (the module docstring)"
    out[open_] = 1
    out[down] = 0
    return out


def _down_counts(c: list[int], total: int, p: np.ndarray) -> np.ndarray:
    """dn(p) = sum_i ceil(c_i p / N) - p for an array of p (int64; Python ints past int64)."""
    if len(p) and not _fits(total, int(p[-1])):
        return np.array([sum(-(-ci * int(x) // total) for ci in c) - int(x) for x in p.tolist()], dtype=np.int64)
    out = -p.copy()
    for ci in c:
        if ci:
            out += -(-ci * p // total)
    return out


def _edf(c: list[int], total: int, a: int, b: int, start: list[int], stop: list[int]) -> np.ndarray:
    """Sources of slots a+1..b: jobs start_i+1..stop_i of each source i, windows clipped to the
    block, earliest deadline first (ties: the lower source)."""
    n, length = len(c), b - a
    releases, keys = [], []
    for i, ci in enumerate(c):
        j = np.arange(start[i] + 1, stop[i] + 1, dtype=object if not _fits(total, ci + 1) else np.int64)
        if len(j):
            releases.append(np.maximum((j - 1) * total // ci, a).astype(np.int64) - a)
            deadline = np.minimum(-(-j * total // ci), b).astype(np.int64) - 1 - a
            keys.append(deadline * n + i)  # one int orders by (deadline, source)
    release = np.concatenate(releases) if releases else np.zeros(0, dtype=np.int64)
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    order = np.argsort(release, kind="stable")
    released_by = np.searchsorted(release[order], np.arange(length), side="right").tolist()
    key_list = key[order].tolist()
    out = [0] * length
    heap: list[int] = []
    nxt = 0
    for slot, end in enumerate(released_by):
        while nxt < end:
            heapq.heappush(heap, key_list[nxt])
            nxt += 1
        deadline, out[slot] = divmod(heapq.heappop(heap), n)
        assert deadline >= slot, "every block is feasible (the module docstring)"
    return np.array(out, dtype=np.int64)
