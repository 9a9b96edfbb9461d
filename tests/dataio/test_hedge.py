"""Hedged ranged reads: a straggler gets a second request, the first to finish wins, within a budget."""

from __future__ import annotations

import threading
import time

import pytest

from dataio.storage.hedge import Hedger, HedgePolicy, process_stats


def _reads(delays: dict[int, float]):
    """A fetch whose n-th call (counting from 0) sleeps delays.get(n, 0.005) seconds and returns n."""
    calls = [0]
    lock = threading.Lock()

    def fn() -> int:
        with lock:
            n = calls[0]
            calls[0] += 1
        time.sleep(delays.get(n, 0.005))
        return n

    return fn, calls


def test_a_straggler_is_hedged_and_the_hedge_wins():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=50, min_history=4))
    fn, calls = _reads({6: 2.0})  # the 7th request stalls 2 s
    before = process_stats()
    start = time.perf_counter()
    results = [hedger.call(fn, 1 << 20) for _ in range(10)]
    elapsed = time.perf_counter() - start
    assert results[:6] == list(range(6)) and results[6] == 7  # the hedge (call 7) answered for the 7th read
    assert hedger.stats.hedged == 1 and hedger.stats.won == 1 and hedger.stats.requests == 10
    assert process_stats().hedged - before.hedged == 1
    assert elapsed < 1.9  # did not wait for the 2 s straggler (a behaviour bound, not a speed claim)


def test_no_hedge_without_history_and_within_budget():
    hedger = Hedger(HedgePolicy(k=2, floor_ms=10, min_history=2, budget_fraction=0.0, burst=1))
    fn, _ = _reads({0: 0.3, 3: 0.5, 5: 0.5})
    assert hedger.call(fn, 100) == 0  # no history yet: waits it out
    for _ in range(2):
        hedger.call(fn, 100)
    assert hedger.call(fn, 100) == 4  # slow: hedged (the one-hedge burst), and the hedge wins
    hedger.call(fn, 100)  # slow again: the budget is spent
    assert hedger.stats.hedged == 1 and hedger.stats.over_budget >= 1


def test_errors_of_both_requests_surface():
    hedger = Hedger(HedgePolicy(k=1, floor_ms=1, min_history=1))
    hedger._record(10, 0.001)

    def fail() -> int:
        time.sleep(0.05)
        raise OSError("boom")

    with pytest.raises(OSError, match="boom"):
        hedger.call(fail, 10)


def test_policy_is_validated():
    with pytest.raises(ValueError):
        HedgePolicy(k=0.5)
    with pytest.raises(ValueError):
        HedgePolicy(budget_fraction=2)


def test_reads_of_the_starting_client_are_not_history_and_a_cold_read_is_hedged_after_cold_ms():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=10, min_history=2, cold_ms=200))
    release = threading.Event()
    calls = [0]
    lock = threading.Lock()

    def fn() -> int:
        with lock:
            n = calls[0]
            calls[0] += 1
        if n == 0:
            release.wait(5)  # the client is starting: nothing finishes for a while
        elif n == 1:
            time.sleep(3.0)  # a straggler among the first reads
        return n

    results: dict[str, int] = {}
    first = threading.Thread(target=lambda: results.setdefault("a", hedger.call(fn, 100)))
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=lambda: results.setdefault("b", hedger.call(fn, 100)))
    second.start()
    time.sleep(0.4)  # past cold_ms, but nothing has finished: no hedge yet
    assert hedger.stats.hedged == 0
    release.set()  # read 0 finishes: from now on read 1 is timed (200 ms), and then it is alone
    first.join(5)
    start = time.perf_counter()
    second.join(5)
    assert results == {"a": 0, "b": 2} and hedger.stats.hedged == 1 and hedger.stats.won == 1
    assert time.perf_counter() - start < 2.5  # did not wait out the 3 s straggler (a behaviour bound)
    assert hedger.threshold_s(100) == 0.2  # neither start-up read became history: still cold


def test_reads_slow_together_are_not_hedged_until_a_younger_one_finishes():
    hedger = Hedger(HedgePolicy(k=2, floor_ms=10, min_history=2, cold_ms=None))
    for _ in range(2):
        hedger._record(100, 0.1)  # threshold 200 ms: the reads below pass it, not twice it
    delays = {0: 0.3, 1: 0.3, 2: 0.3, 3: 0.3, 4: 2.0, 5: 0.05}
    fn, calls = _reads(delays)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        together = [pool.submit(hedger.call, fn, 100) for _ in range(4)]  # all 3x the median, together
        assert sorted(f.result() for f in together) == [0, 1, 2, 3]
        assert hedger.stats.hedged == 0  # a busy store: nobody overtaken, no second requests
        straggler = pool.submit(hedger.call, fn, 100)  # call 4: 2 s, the only read in flight
    assert straggler.result() == 5 and hedger.stats.hedged == 1  # hedged alone; the hedge won


def test_a_size_never_seen_is_hedged_from_other_sizes_scaled_up_and_history_is_shared():
    from dataio.storage.hedge import LatencyHistory

    history = LatencyHistory()
    hedger = Hedger(HedgePolicy(k=3, floor_ms=10, min_history=4, cold_ms=2000), history)
    for size in (100, 1 << 20, 100, 1 << 20):
        hedger._record(size, 0.02)  # HEADs and 1 MiB reads, 20 ms each
    # A 2 MiB read: 1 MiB reads scaled up (40 ms) and small ones scaled from 64 KiB (640 ms);
    # the median of the four, times k, and never later than cold_ms.
    assert hedger.threshold_s(2 << 20) == pytest.approx(3 * (0.04 + 0.64) / 2)
    assert hedger.threshold_s(8 << 20) == 2.0
    # Another Hedger on the same history (another Store of the same store) starts from it.
    assert Hedger(HedgePolicy(k=3, floor_ms=10, min_history=4, cold_ms=2000), history).threshold_s(2 << 20) == \
        hedger.threshold_s(2 << 20)


def test_a_forked_child_keeps_the_latency_history_with_a_fresh_lock():
    import multiprocessing as mp

    from dataio.storage.hedge import shared_history

    history = shared_history("test|fork")
    history.add(1 << 20, 0.05)
    with history.lock:  # held by this thread across the fork: the child must not inherit it held
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=_report_history, args=(q,))
        child.start()
    child.join(20)
    assert q.get(timeout=5) == [(1 << 20, 0.05)]


def _report_history(q) -> None:  # noqa: ANN001 - runs in the forked child
    from dataio.storage.hedge import shared_history

    h = shared_history("test|fork")
    with h.lock:
        q.put(list(h.recent))


def test_a_hedge_that_stalls_too_gets_another():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=50, min_history=4, burst=4))
    fn, calls = _reads({6: 3.0, 7: 3.0})  # the 7th read stalls, and so does its hedge
    start = time.perf_counter()
    results = [hedger.call(fn, 1 << 20) for _ in range(8)]
    assert results[6] == 8 and hedger.stats.hedged == 2 and hedger.stats.won == 1
    assert time.perf_counter() - start < 2.5  # waited out neither 3 s straggler (a behaviour bound)
