"""A mixture epoch's interleaving: which source owns each of N positions, with random access.

Two schemes, both within 1 of the shares over every prefix, neither needing a pass over the epoch:
a binary tree of Sturmian splits where its bound is below 1 (always up to four sources; vectorised,
so a worker of a billion-sample epoch plans only its own positions), else deadlines.py (every
source's j-th position inside its window, earliest deadline first within blocks whose boundary
states are chosen without a pass: within 1 - 1/(2k-2) for any number k of sources, Tijdeman's
bound, the best that holds for all shares; O(block) per block touched).

The tree over the sources (those with a count > 0) splits each node's m positions between its
children of a and m - a positions by the Sturmian rule left_count(p) = floor(p * a / m + 1/2),
so each split is within 1/2 of its share over any prefix. A split's error reaches a source below
it scaled by the source's share of the child it went to, so over any prefix source s strays from
its share by at most

    bound(s) = 1/2 * (1 + sum(count_s / count_H for every subtree H strictly between s and the root))

(1/2 for a child of the root). Any tree keeps this below 1 for up to four sources; for more it
depends on the shape, so the shape is chosen to make the largest bound(s) small: the best of all
trees by a search over subsets of sources up to _SEARCH_UP_TO sources (pairing a large source
with a tiny one only where nothing else lies above the pair); past that the same search over
groups of the smallest sources, or a heuristic, improved by moving subtrees (up to _IMPROVE_UP_TO
sources). Where the best bound found is 1 or more, the deadline scheme is used instead, unless
its block (2N / the smallest count) exceeds _MAX_BLOCK positions (a source with under N / 2^19
positions an epoch): then the tree stays, and max_deviation says its bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from dataio.plan.deadlines import DeadlineOrder

_MAX_BLOCK = 1 << 20  # positions: filling one costs about a second; past it the tree stays
_SEARCH_UP_TO = 8  # sources: 3^n / 2 splits per probe of the search, ~40 probes (0.1 s at 8)
_PROBES = 40  # bisections of the search's bound: far below any difference that matters
_IMPROVE_UP_TO = 16  # sources: past the search, a local search improves the best shape found (< 1 s)
_IMPROVE_ROUNDS = 8  # moves at most (each tries every subtree beside every node: O(n^2) bounds)


class Interleave:
    """The interleaving of `counts` (n,) int64 positions per source, N = counts.sum() in all."""

    def __init__(self, counts: np.ndarray, *, scheme: str | None = None) -> None:
        """`scheme` ("tree" or "deadlines") overrides the choice, for tests and comparisons."""
        self.counts = np.asarray(counts, dtype=np.int64)
        leaves = [i for i, c in enumerate(self.counts.tolist()) if c > 0]
        self.shape = _choose_shape(leaves, self.counts.tolist()) if leaves else None
        self.tree = None if self.shape is None else _with_counts(self.shape, self.counts)
        tree_bound = _bound(self.shape, self.counts.tolist()) if self.shape is not None else 0.0
        if scheme is None:
            # The bound is a float sum: a margin keeps a tree whose exact bound is 1 from passing.
            within = tree_bound < 1 - 1e-9
            scheme = "tree" if within or DeadlineOrder.block_for(self.counts) > _MAX_BLOCK else "deadlines"
        if scheme not in ("tree", "deadlines"):
            raise ValueError(f"scheme must be 'tree' or 'deadlines', got {scheme!r}")
        self.scheme = scheme
        self._deadlines = DeadlineOrder(self.counts) if scheme == "deadlines" else None
        self._bound = tree_bound if self._deadlines is None else self._deadlines.max_deviation

    @property
    def max_deviation(self) -> float:
        """Over any prefix, no source's count strays further than this from its share x length
        (the tree's bound, or the deadline scheme's 1 - 1/(2k-2) for k sources)."""
        return self._bound

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, k) of positions `pos` (int64, any order): the position is source's k-th."""
        if self._deadlines is not None:
            return self._deadlines.locate(pos)
        pos = np.asarray(pos, dtype=np.int64)
        source, k = np.empty_like(pos), np.empty_like(pos)
        _route(self.tree, pos, np.arange(len(pos)), source, k)
        return source, k

    def prefix_counts(self, length: int) -> np.ndarray:
        """(n,) int64: how many of the first `length` positions each source owns."""
        if self._deadlines is not None:
            return self._deadlines.prefix_counts(length)
        out = np.zeros(len(self.counts), dtype=np.int64)
        _prefix(self.tree, int(length), out)
        return out


# --- choosing the shape -------------------------------------------------------------------------
# A shape is a leaf (a source index) or a pair of shapes; a tree is a leaf or (left, right, a, m).

def _choose_shape(leaves: list[int], counts: Sequence[int]) -> object:
    if len(leaves) <= 2:
        return leaves[0] if len(leaves) == 1 else (leaves[0], leaves[1])
    # Past _SEARCH_UP_TO sources the search runs over groups: the smallest merged first (Huffman)
    # until _SEARCH_UP_TO subtrees remain, each kept as it is.
    heap = [(counts[i], i, i) for i in leaves]
    heapq.heapify(heap)
    tie = max(leaves) + 1
    while len(heap) > _SEARCH_UP_TO:
        ca, _, a = heapq.heappop(heap)
        cb, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (ca + cb, tie, (b, a)))
        tie += 1
    atoms = [shape for _, _, shape in sorted(heap, key=lambda e: e[1])]
    searched = _searched(atoms, counts)
    if len(leaves) <= _SEARCH_UP_TO:
        return searched
    candidates = [searched, _huffman(leaves, counts), _halved(leaves, counts)]
    best = min(candidates, key=lambda shape: _bound(shape, counts))  # the first of equals
    return _improved(best, counts) if len(leaves) <= _IMPROVE_UP_TO else best


def _improved(shape: object, counts: Sequence[int]) -> object:
    """Local search: move one subtree beside any other node while that lowers the bound (best move
    first, at most _IMPROVE_ROUNDS moves)."""
    best = _bound(shape, counts)
    for _ in range(_IMPROVE_ROUNDS):
        paths = list(_paths(shape))
        found = None
        for cut in paths:
            if not cut:
                continue
            moved, rest = _get(shape, cut), _prune(shape, cut)
            for at in _paths(rest):
                candidate = _replace(rest, at, (_get(rest, at), moved))
                value = _bound(candidate, counts)
                if value < best - 1e-12:
                    best, found = value, candidate
        if found is None:
            break
        shape = found
    return shape


def _paths(shape: object, path: tuple[int, ...] = ()):
    """Every node's path from the root (a tuple of child indices), the root's () first."""
    yield path
    if not isinstance(shape, int):
        for i, child in enumerate(shape):  # type: ignore[arg-type]
            yield from _paths(child, (*path, i))


def _get(shape: object, path: tuple[int, ...]) -> object:
    for i in path:
        shape = shape[i]  # type: ignore[index]
    return shape


def _replace(shape: object, path: tuple[int, ...], new: object) -> object:
    if not path:
        return new
    children = list(shape)  # type: ignore[call-overload]
    children[path[0]] = _replace(children[path[0]], path[1:], new)
    return tuple(children)


def _prune(shape: object, path: tuple[int, ...]) -> object:
    """The shape without the subtree at `path` (its sibling takes their parent's place)."""
    parent = path[:-1]
    return _replace(shape, parent, _get(shape, parent)[1 - path[-1]])  # type: ignore[index]


def _bound(shape: object, counts: Sequence[int]) -> float:
    """The largest prefix deviation the tree allows any source (the module docstring's bound)."""
    if isinstance(shape, int):
        return 0.0
    return 0.5 * (1.0 + max(_excess(child, counts)[1] for child in shape))  # type: ignore[union-attr]


def _excess(shape: object, counts: Sequence[int]) -> tuple[int, float, list[tuple[int, float]]]:
    """(subtree count, the largest count_s * sum(1/count_H over H from s's parent up to this
    subtree, root excluded), and every source's (count_s, that sum)). A leaf adds nothing."""
    if isinstance(shape, int):
        return counts[shape], 0.0, [(counts[shape], 0.0)]
    left, right = (_excess(child, counts) for child in shape)  # type: ignore[union-attr]
    total = left[0] + right[0]
    inv = 1.0 / total
    leaves = [(x, v + inv) for x, v in left[2] + right[2]]
    return total, max(x * v for x, v in leaves), leaves


def _count(shape: object, counts: Sequence[int]) -> int:
    return counts[shape] if isinstance(shape, int) else sum(_count(c, counts) for c in shape)  # type: ignore[union-attr]


def _searched(atoms: list[object], counts: Sequence[int]) -> object:
    """The shape with the smallest bound, found by bisecting the bound: a bound c is reachable iff
    the root can be split into subtrees L, R with g(L), g(R) >= 0, where g(S) is the most that the
    subtrees above S may add to sum(1/count_H) with every source s in S keeping count_s * sum <= c:
    g({s}) = c / count_s, g(S) = max over splits of min(g(L), g(R)) - 1 / count_S."""
    n = len(atoms)
    x = [float(_count(a, counts)) for a in atoms]
    size = [0.0] * (1 << n)
    for mask in range(1, 1 << n):
        low = (mask & -mask).bit_length() - 1
        size[mask] = size[mask & (mask - 1)] + x[low]
    masks = sorted(range(1, 1 << n), key=lambda m: (m.bit_count(), m))

    def probe(c: float) -> list[int] | None:
        """Each subset's best split (its left part's mask) when c is reachable, else None."""
        g, split = [0.0] * (1 << n), [0] * (1 << n)
        for mask in masks:
            if mask & (mask - 1) == 0:
                g[mask] = _atom_budget(atoms[mask.bit_length() - 1], counts, c)
                continue
            low = mask & -mask
            rest, best, sub = mask ^ low, -1.0e300, mask ^ low
            while True:  # every left part holding the lowest source: each split once
                left = low | sub
                if left != mask:
                    v = min(g[left], g[mask ^ left])
                    if v > best:
                        best, split[mask] = v, left
                if sub == 0:
                    break
                sub = (sub - 1) & rest
            g[mask] = best - (1.0 / size[mask] if mask != (1 << n) - 1 else 0.0)
        return split if g[(1 << n) - 1] >= 0.0 else None

    ones = [1] * len(counts)  # every term count_s / count_H <= 1: no sum exceeds the sources' number
    lo, hi = 0.0, float(sum(_count(a, ones) for a in atoms))
    best_split = probe(hi)
    for _ in range(_PROBES):
        mid = (lo + hi) / 2.0
        found = probe(mid)
        if found is None:
            lo = mid
        else:
            hi, best_split = mid, found
    assert best_split is not None

    def build(mask: int) -> object:
        if mask & (mask - 1) == 0:
            return atoms[mask.bit_length() - 1]
        left = best_split[mask]
        return (build(left), build(mask ^ left))

    return build((1 << n) - 1)


def _atom_budget(atom: object, counts: Sequence[int], c: float) -> float:
    """g of a fixed subtree (see _searched): c / count_s for a source, min over children - 1/count."""
    if isinstance(atom, int):
        return c / counts[atom]
    left, right = atom  # type: ignore[misc]
    return min(_atom_budget(left, counts, c), _atom_budget(right, counts, c)) - 1.0 / _count(atom, counts)


def _huffman(leaves: list[int], counts: Sequence[int]) -> object:
    """The two smallest subtrees merged first (equal counts give balanced trees)."""
    heap = [(counts[i], i, i) for i in leaves]
    heapq.heapify(heap)
    tie = max(leaves) + 1
    while len(heap) > 1:
        ca, _, a = heapq.heappop(heap)
        cb, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (ca + cb, tie, (b, a)))
        tie += 1
    return heap[0][2]


def _halved(leaves: list[int], counts: Sequence[int]) -> object:
    """Top down, each set split into two of nearly equal count (largest first to the lighter side):
    large sources end up near the root, alone, and small ones grouped with small ones."""
    if len(leaves) == 1:
        return leaves[0]
    sides: tuple[list[int], list[int]] = ([], [])
    weight = [0, 0]
    for i in sorted(leaves, key=lambda i: (-counts[i], i)):
        side = 0 if weight[0] <= weight[1] else 1
        sides[side].append(i)
        weight[side] += counts[i]
    if not sides[1]:  # one source outweighs the rest together: it takes one side alone
        sides = ([sides[0][0]], sides[0][1:])
    return (_halved(sides[0], counts), _halved(sides[1], counts))


# --- random access ------------------------------------------------------------------------------

def _with_counts(shape: object, counts: np.ndarray) -> object:
    if isinstance(shape, int):
        return shape
    left, right = (_with_counts(child, counts) for child in shape)  # type: ignore[union-attr]
    a, b = _subtree_count(left, counts), _subtree_count(right, counts)
    return (left, right, a, a + b)


def _subtree_count(node: object, counts: np.ndarray) -> int:
    return int(counts[node]) if isinstance(node, int) else node[3]  # type: ignore[index]


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
