"""An interleaving within 1 - 1/(2k-2) of the shares over every prefix, for any k >= 2 sources.

Source i owns c_i of N positions, share w_i = c_i / N; let d = 1/(2k-2). Its j-th position must
fall in slots (1-based) [ceil((j-1+d) / w_i), floor((j-d) / w_i) + 1], its window: then after t
slots it owns between ceil(w_i t + d) - 1 and floor(w_i t + 1 - d) positions (all windows ending
by t are served, none starting after t), i.e. |count - w_i t| <= 1 - d over every prefix, and
exactly c_i at the end. Tijdeman (1973, 1980: the chairman assignment problem) proved that a
sequence within 1 - 1/(2k-2) of any k shares exists, and that no smaller bound holds for every
choice of shares; such a sequence puts every position in its window, so an assignment exists and
earliest-deadline-first (EDF) finds one. EDF is sequential, so the epoch is cut into blocks of
B >= 2N / min(c) slots and only the block holding a position is filled, from boundary states
chosen without a pass. Proof that every block can be filled:

A state at t is each source's count X_i(t) in its range [lo_i, hi_i] above (one or two values);
U = the sources at lo_i + 1, |U| = r(t) = t - sum lo_i. Block [a, b] is fillable iff no count goes
down (w_i B >= 2 puts lo_i(b) at or above hi_i(a)) and Hall holds on its prefixes, suffixes and
inner intervals (windows are intervals, so intervals are the sets to check); inner ones hold
because the whole epoch's assignment exists, and
  P(a): for q in (a, b]: sum_i max(0, due_i(q) - X_i(a)) <= q - a, due_i(q) = the windows of i
        ending by q; a source in U(a) lowers its term by 1 iff due_i(q) > lo_i: a lower bound on
        |U(a) n E_q|, E_q = {i : the deadline of i's job lo_i + 1 is <= q} (a chain);
  S(b): for p in [a, b): sum_i max(0, X_i(b) - released_i(p)) <= b - p; a source in U(b) raises
        its term by 1 iff released_i(p) <= lo_i: an upper bound on |U(b) n C_p|, C_p = {i : the
        release of i's job lo_i + 1 is after p} (a chain).
P is about the state at a alone, S about the state at b alone. The U meeting S(t) are the
independent sets of a matroid (capacities on the chain C_p); the greedy basis of size r(t), taking
first the sources whose next job is due first, is Gale-optimal: it has the most members in every
E_q. The whole-epoch assignment passes through a state at t meeting S(t) and P(t), so the greedy
state meets P(t) too: every block is fillable, and EDF fills it, in O(B log k) per block touched.
"""

from __future__ import annotations

import heapq

import numpy as np

_MIN_BLOCK = 4096  # slots: amortises a boundary's O(n^2) choice over many positions
_CACHE_BLOCKS = 16  # filled blocks kept per order (a worker reads a few consecutive ones)


class DeadlineOrder:
    """The interleaving of `counts` (n,) int64 within 1 - 1/(2k-2) of the shares over every prefix
    (k: the sources with a count > 0; exact for k = 1)."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.total = int(self.counts.sum())
        self.block = self.block_for(self.counts)
        k = int(np.count_nonzero(self.counts))
        self._m = max(2 * k - 2, 1)  # d = 1/m; with one source any d gives the one sequence
        self._filled: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._states: dict[int, np.ndarray] = {}  # boundary -> counts (each is two blocks' end)

    @staticmethod
    def block_for(counts: np.ndarray) -> int:
        """Positions per block: at least 2N / the smallest count (every source's range of counts
        moves past its old one within a block), at least _MIN_BLOCK, at most N."""
        counts = np.asarray(counts, dtype=np.int64)
        positive = counts[counts > 0]
        total = int(counts.sum())
        need = -(-2 * total // int(positive.min())) if len(positive) else 1
        return max(1, min(total, max(need, _MIN_BLOCK)))

    @property
    def max_deviation(self) -> float:
        """Over every prefix each count is within this of share x length: 1 - 1/(2k-2)."""
        return 1.0 - 1.0 / self._m if np.count_nonzero(self.counts) > 1 else 0.0

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, k) of positions `pos` (int64, any order): the position is source's k-th."""
        pos = np.asarray(pos, dtype=np.int64)
        source, k = np.empty_like(pos), np.empty_like(pos)
        blocks = pos // self.block
        order = np.argsort(blocks, kind="stable")  # positions grouped by block, one pass each
        cuts = np.flatnonzero(np.diff(blocks[order])) + 1
        for at in np.split(order, cuts) if len(order) else []:
            b = int(blocks[at[0]])
            start, src, rank = self._fill(b)
            within = pos[at] - b * self.block
            source[at] = src[within]
            k[at] = start[src[within]] + rank[within]
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
        counts = _state(c.tolist(), n_total, self._m, t, self.block)
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
        src = _edf(self.counts.tolist(), self.total, self._m, a, end, start.tolist(), stop.tolist())
        rank = np.empty_like(src)
        for s in np.unique(src).tolist():
            at = np.flatnonzero(src == s)
            rank[at] = np.arange(len(at))
        if len(self._filled) >= _CACHE_BLOCKS:
            self._filled.clear()
        self._filled[b] = (start, src, rank)
        return start, src, rank


def _floor_shifted(a: np.ndarray, t: np.ndarray, total: int, add: int, m: int) -> np.ndarray:
    """floor(a t / N + add / m) elementwise, exactly: a t split by N first, so nothing overflows
    int64 while N^2 fits (past that the arrays hold Python ints)."""
    q, r = _divmod(a * t, total)
    return q + (m * r + add * total) // (m * total)


def _divmod(x: np.ndarray, y: int) -> tuple[np.ndarray, np.ndarray]:
    q = x // y  # np.divmod has no object (Python int) loop
    return q, x - q * y


def _ints(values, total: int) -> np.ndarray:
    return np.array(values, dtype=np.int64 if total * total < (1 << 62) else object)


def _ranges(c: list[int], total: int, m: int, t: int) -> tuple[list[int], list[int]]:
    """Each source's lowest and highest count after t slots: ceil(w t + d) - 1 and floor(w t + 1 - d)."""
    lo = [max(0, -((-ci * t * m - total) // (m * total)) - 1) for ci in c]
    hi = [min(ci, (ci * t * m + (m - 1) * total) // (m * total)) for ci in c]
    return lo, hi


def _state(c: list[int], total: int, m: int, t: int, block: int) -> np.ndarray:
    """(n,) int64 counts at boundary t: lo, plus 1 for the greedy U of the module docstring."""
    lo, hi = _ranges(c, total, m, t)
    free = [i for i, ci in enumerate(c) if hi[i] > lo[i]]
    num_up = t - sum(lo)
    assert 0 <= num_up <= len(free), "a boundary state always exists (the module docstring)"
    out = np.array(lo, dtype=np.int64)
    if num_up in (0, len(free)):
        out[free] += 1 if num_up else 0
        return out
    # C_p holds i for p <= last_i (job lo_i + 1 released after p); E_q from q >= due_i.
    last = {i: -(-((lo[i] * m + 1) * total) // (m * c[i])) - 1 for i in free}
    due = {i: ((lo[i] + 1) * m - 1) * total // (m * c[i]) + 1 for i in free}
    p = _ints(range(max(0, t - block), t), total)
    room = (t - p) - _released_excess(c, lo, total, m, p)  # what S(t) leaves U at each p
    by_last = np.array(sorted(last.values(), reverse=True))
    size_at = np.searchsorted(-by_last, -p, side="right")  # |C_p| = #{i : last_i >= p}
    cap = {int(s): int(room[size_at == s].min()) for s in np.unique(size_at).tolist() if s}
    need = {i: sum(1 for j in free if last[j] >= last[i]) for i in free}  # i is in C_p iff |C_p| >= this
    used = dict.fromkeys(cap, 0)
    up: list[int] = []
    for i in sorted(free, key=lambda i: (due[i], i)):  # next job due first (ties: the lower source)
        sizes = [s for s in cap if s >= need[i]]
        if all(used[s] < cap[s] for s in sizes):
            for s in sizes:
                used[s] += 1
            up.append(i)
            if len(up) == num_up:
                break
    assert len(up) == num_up, "a boundary state always exists (the module docstring)"
    out[up] += 1
    return out


def _released_excess(c: list[int], lo: list[int], total: int, m: int, p: np.ndarray) -> np.ndarray:
    """sum_i max(0, lo_i - released_i(p)) for an array of p, released_i(p) = min(c_i,
    floor(w_i p + 1 - d)): the jobs below the state that are not released by p."""
    out = np.zeros(len(p), dtype=np.int64)
    for ci, li in zip(c, lo):
        if ci and li:
            released = np.minimum(_floor_shifted(_ints([ci], total), p, total, m - 1, m), ci)
            out += np.maximum(li - released, 0).astype(np.int64)
    return out


def _edf(c: list[int], total: int, m: int, a: int, b: int, start: list[int], stop: list[int]) -> np.ndarray:
    """Sources of slots a+1..b: jobs start_i+1..stop_i of each source i, windows clipped to the
    block, earliest deadline first (ties: the lower source)."""
    n, length = len(c), b - a
    releases, keys = [], []
    for i, ci in enumerate(c):
        j = _ints(range(start[i] + 1, stop[i] + 1), total)
        if len(j):
            # Window of job j: [ceil((j-1+d) N / c), floor((j-d) N / c) + 1], in 1-based slots.
            q, r = _divmod((j - 1) * total, ci)
            release = q - (-(m * r + total) // (m * ci))
            q, r = _divmod(j * total, ci)
            deadline = q + (m * r - total) // (m * ci) + 1
            releases.append(np.maximum(release, a + 1).astype(np.int64) - 1 - a)
            keys.append((np.minimum(deadline, b).astype(np.int64) - 1 - a) * n + i)  # (deadline, source)
    release = np.concatenate(releases) if releases else np.zeros(0, dtype=np.int64)
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    order = np.argsort(release, kind="stable")
    released_by = np.searchsorted(release[order], np.arange(length), side="right").tolist()
    key_list = key[order].tolist()
    popped = []
    heap: list[int] = []
    push, pop, nxt = heapq.heappush, heapq.heappop, 0
    for end in released_by:  # slot by slot: the released job due first
        while nxt < end:
            push(heap, key_list[nxt])
            nxt += 1
        popped.append(pop(heap))
    chosen = np.array(popped, dtype=np.int64)
    assert (chosen // n >= np.arange(length)).all(), "every block is feasible (the module docstring)"
    return chosen % n
