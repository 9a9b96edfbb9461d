"""A mixture epoch's interleaving (dataio/plan/interleave.py, deadlines.py): over every prefix each
source's count is within 1 of its share x the length for any number of sources (the deadline
order: within 1 - 1/(2k-2) for k sources), checked over every prefix; exact per-source counts;
random access that agrees with the whole sequence."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataio.plan import deadlines
from dataio.plan.deadlines import DeadlineOrder
from dataio.plan.interleave import Interleave

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# 1-24 sources: empty and tiny ones, middling and large ones, so shares span three decades.
many_counts = st.lists(st.one_of(st.integers(0, 3), st.integers(1, 60), st.integers(100, 2000)),
                       min_size=1, max_size=24).filter(lambda c: sum(c) > 0)


@contextmanager
def min_block(slots: int):
    """Blocks as short as the proof allows (2N / the smallest count), so tests cross many of them."""
    saved, deadlines._MIN_BLOCK = deadlines._MIN_BLOCK, slots
    try:
        yield
    finally:
        deadlines._MIN_BLOCK = saved


def prefix_table(order, counts: np.ndarray) -> np.ndarray:
    """(N+1, n) int64: each source's count over every prefix, from locate; checks the draws."""
    n, total = len(counts), int(counts.sum())
    source, k = order.locate(np.arange(total))
    cum = np.zeros((total + 1, n), dtype=np.int64)
    for s in range(n):
        cum[1:, s] = np.cumsum(source == s)
        assert np.array_equal(k[source == s], np.arange(counts[s]))  # each source's draws in order
    assert cum[-1].tolist() == counts.tolist()  # exact per-source counts
    return cum


def worst_deviation(cum: np.ndarray, counts: np.ndarray) -> float:
    """max over prefixes t and sources i of |count_i(t) - c_i t / N|, computed in integers."""
    total = int(counts.sum())
    scaled = np.abs(cum * total - np.arange(total + 1)[:, None] * counts[None, :])  # N x deviation
    return int(scaled.max()) / total


@SETTINGS
@given(counts=many_counts, slots=st.sampled_from([1, 3, 4096]))
def test_deadline_order_is_within_tijdemans_bound_over_every_prefix(counts, slots):
    counts = np.array(counts, dtype=np.int64)
    k = np.count_nonzero(counts)
    with min_block(slots):
        order = DeadlineOrder(counts)
        assert order.max_deviation == (1 - 1 / (2 * k - 2) if k > 1 else 0.0)
        cum = prefix_table(order, counts)
        assert worst_deviation(cum, counts) <= order.max_deviation + 1e-12
        blocks = range(0, int(counts.sum()) + 1, order.block)
        for length in {*blocks, *(b + 1 for b in blocks), int(counts.sum()) // 3}:
            length = min(length, int(counts.sum()))
            assert order.prefix_counts(length).tolist() == cum[length].tolist()


@SETTINGS
@given(counts=many_counts)
def test_every_mixture_is_interleaved_within_1(counts):
    counts = np.array(counts, dtype=np.int64)
    order = Interleave(counts)
    assert order.max_deviation < 1  # the tree where its bound is below 1, else the deadline order
    assert worst_deviation(prefix_table(order, counts), counts) <= order.max_deviation + 1e-12


@settings(max_examples=25, deadline=None)
@given(counts=many_counts, data=st.data())
def test_random_access_agrees_with_the_whole_sequence(counts, data):
    counts = np.array(counts, dtype=np.int64)
    total = int(counts.sum())
    with min_block(1):
        whole = DeadlineOrder(counts).locate(np.arange(total))
        order = DeadlineOrder(counts)  # a fresh one: nothing cached, positions in any order
        pos = np.array(data.draw(st.lists(st.integers(0, total - 1), max_size=40)), dtype=np.int64)
        source, k = order.locate(pos)
        assert source.tolist() == whole[0][pos].tolist() and k.tolist() == whole[1][pos].tolist()
        length = data.draw(st.integers(0, total))
        assert order.prefix_counts(length).tolist() == np.bincount(whole[0][:length], minlength=len(counts)).tolist()


def test_a_mixture_past_the_trees_bound_gets_the_deadline_order():
    counts = np.array([41, 9, 231, 8, 22, 2, 16, 4, 6, 178, 6])  # the best tree found: 1.02
    assert Interleave(counts, scheme="tree").max_deviation > 1
    order = Interleave(counts)
    assert order.scheme == "deadlines" and order.max_deviation == 1 - 1 / 20  # 11 sources
    assert worst_deviation(prefix_table(order, counts), counts) <= 1 - 1 / 20 + 1e-12
    assert Interleave([5, 3, 1]).scheme == "tree"  # below 1 for any tree up to four sources
    with pytest.raises(ValueError, match="scheme must be"):
        Interleave(counts, scheme="sturmian")


def test_a_billion_position_epoch_is_located_far_from_its_start_without_a_pass():
    rng = np.random.default_rng(7)
    counts = (10 ** rng.uniform(4, 7, 20)).astype(np.int64)
    counts[0] += 10**9 - counts.sum()  # N = 1e9, 20 sources over three decades
    order = Interleave(counts, scheme="deadlines")
    start = 987_654_321
    source, _ = order.locate(np.arange(start, start + 5000))
    before = order.prefix_counts(start)
    running = before + np.cumsum(np.eye(20, dtype=np.int64)[source], axis=0)  # (5000, 20) per prefix
    lengths = np.arange(start + 1, start + 5001)
    scaled = np.abs(running * 10**9 - lengths[:, None] * counts[None, :])
    assert int(scaled.max()) / 10**9 <= 1 - 1 / 38 + 1e-12  # within 1 - 1/(2k-2) over those prefixes
    assert order.prefix_counts(start + 5000).tolist() == running[-1].tolist()
    assert order.prefix_counts(10**9).tolist() == counts.tolist()


def test_the_order_is_deterministic():
    counts = np.array([300, 7, 0, 45, 1, 1, 120, 9, 33, 2, 64, 18])
    with min_block(1):
        a = DeadlineOrder(counts).locate(np.arange(600))
        b = DeadlineOrder(counts).locate(np.arange(600)[::-1])
    assert a[0].tolist() == b[0][::-1].tolist() and a[1].tolist() == b[1][::-1].tolist()


@pytest.mark.parametrize("counts", [
    [1] * 30,  # thirty equal sources of one position each
    [1000] + [1] * 25,  # one large source and many single positions
    list(range(1, 31)),
    [2**k for k in range(14)],  # shares over four decades
    [3000, 2500, 1200, 900, 700, 400, 300, 120, 90, 60, 30, 12, 5, 3, 2, 1, 1, 0, 7, 11, 13],
])
def test_many_sources_stay_within_1(counts):
    counts = np.array(counts, dtype=np.int64)
    with min_block(1):
        order = DeadlineOrder(counts)
        assert worst_deviation(prefix_table(order, counts), counts) <= order.max_deviation + 1e-12 < 1
    order = Interleave(counts)
    assert worst_deviation(prefix_table(order, counts), counts) <= order.max_deviation < 1


def test_the_tree_stays_where_a_block_would_be_too_long(monkeypatch):
    import dataio.plan.interleave as interleave

    counts = np.array([41, 9, 231, 8, 22, 2, 16, 4, 6, 178, 6])
    monkeypatch.setattr(interleave, "_MAX_BLOCK", 100)  # its block (4,096 positions) counts as too long
    order = Interleave(counts)
    assert order.scheme == "tree" and order.max_deviation > 1  # the bound in use, reported honestly
    assert worst_deviation(prefix_table(order, counts), counts) <= order.max_deviation + 1e-12


@pytest.mark.parametrize("counts", [[0, 0], [5], [0, 7, 0], [3, 4]])
def test_degenerate_mixtures_in_the_deadline_order(counts):
    counts = np.array(counts, dtype=np.int64)
    order = Interleave(counts, scheme="deadlines")
    if counts.sum():
        assert worst_deviation(prefix_table(order, counts), counts) <= order.max_deviation + 1e-12
    assert order.max_deviation == (0.5 if np.count_nonzero(counts) == 2 else 0.0)
    assert order.prefix_counts(int(counts.sum())).tolist() == counts.tolist()
