"""Hedged ranged reads: a straggler gets a second request, the first to finish wins, within a budget."""

from __future__ import annotations

import threading
import time

import pytest

from dataio.storage.hedge import Hedger, HedgePolicy, process_stats


def _reads(delays: dict[int, float], *, held: tuple[int, ...] = (), release: threading.Event | None = None):
    """A fetch whose n-th call (counting from 0) sleeps delays.get(n, 0.005) seconds and returns n; a
    call numbered in `held` (a straggler) waits for `release` instead: for a minute, if never set."""
    calls = [0]
    lock = threading.Lock()

    def fn() -> int:
        with lock:
            n = calls[0]
            calls[0] += 1
        if n in held:
            assert release is not None
            release.wait(STRAGGLER_S)
        else:
            time.sleep(delays.get(n, 0.005))
        return n

    return fn, calls


# A straggler waits for an event the test sets once it has its answer: a read that came back
# while the straggler still ran was hedged, whatever the machine's load (no elapsed-time bound).
STRAGGLER_S = 60.0


def test_a_straggler_is_hedged_and_the_hedge_wins():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=50, min_history=4))
    release = threading.Event()
    fn, calls = _reads({}, held=(6,), release=release)  # the 7th request stalls
    before = process_stats()
    try:
        results = [hedger.call(fn, 1 << 20) for _ in range(10)]
        assert not release.is_set()  # all ten answered while the straggler was still out
    finally:
        release.set()
    assert results[:6] == list(range(6)) and results[6] == 7  # the hedge (call 7) answered for the 7th read
    assert hedger.stats.hedged == 1 and hedger.stats.won == 1 and hedger.stats.requests == 10
    assert process_stats().hedged - before.hedged == 1


def test_a_small_stalled_request_is_hedged_after_the_small_floor():
    # An index, a checksum sidecar or a HEAD takes milliseconds: its floor is small_floor_ms, not the
    # floor_ms of large reads, so a 150 ms stall of one is hedged (it would not be under a 200 ms floor).
    policy = HedgePolicy(k=3, floor_ms=200, small_floor_ms=50, min_history=4)
    hedger = Hedger(policy)
    fn, calls = _reads({6: 0.15})
    results = [hedger.call(fn, 4096) for _ in range(8)]
    assert hedger.stats.hedged == 1 and calls[0] == 9 and results[:6] == list(range(6))
    assert policy.floor_s(0) == policy.floor_s(64 << 10) == 0.05 and policy.floor_s(16 << 20) == 0.2
    assert 0.05 < policy.floor_s(2 << 20) < 0.2  # growing with the size in between
    small = Hedger(policy)
    for _ in range(4):
        small._record(4096, 0.005)  # four 5 ms reads: 3 x their median is under the small floor
    assert small.threshold_s(4096) == pytest.approx(0.05)
    assert HedgePolicy(floor_ms=10, small_floor_ms=50).floor_s(0) == 0.01  # never above floor_ms


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


def test_the_starting_clients_first_read_is_not_history_and_a_cold_read_is_hedged_after_cold_ms():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=10, min_history=2, cold_ms=200))
    release, straggler = threading.Event(), threading.Event()
    calls = [0]
    lock = threading.Lock()

    def fn() -> int:
        with lock:
            n = calls[0]
            calls[0] += 1
        if n == 0:
            release.wait(STRAGGLER_S)  # the client is starting: nothing finishes for a while
        elif n == 1:
            straggler.wait(STRAGGLER_S)  # a straggler among the first reads
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
    first.join(STRAGGLER_S)
    second.join(STRAGGLER_S / 2)  # answered by its hedge while the straggler still waits
    straggler.set()
    assert results == {"a": 0, "b": 2} and hedger.stats.hedged == 1 and hedger.stats.won == 1
    # The client's first read did not become history, the hedge that won did: with so few reads,
    # k x the slowest of them sets the threshold, no longer cold_ms.
    assert len(hedger.history.recent) == 1 and hedger.threshold_s(100) < 0.2


def test_a_read_that_waited_for_the_starting_client_counts_from_when_it_was_ready():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=10, min_history=2))
    ago_s = 1000.0  # reads started this long ago, with the client (longer than any test runs)
    start = time.perf_counter()
    began = start - ago_s
    hedger._record(100, ago_s, began)  # the first to finish: the client's start, not history
    assert not hedger.history.recent
    time.sleep(0.02)
    hedger._record(100, ago_s + 0.02, began)  # served 20 ms after the client was ready
    (size, seconds), = hedger.history.recent
    # Counted from when the client was ready (at least the 20 ms slept, at most this test's own
    # time so far), not from when the read began, 1000 s ago.
    assert size == 100 and 0.02 <= seconds <= time.perf_counter() - start


def test_reads_slow_together_are_not_hedged_until_a_younger_one_finishes():
    hedger = Hedger(HedgePolicy(k=2, floor_ms=10, min_history=2, cold_ms=None))
    for _ in range(2):
        hedger._record(100, 0.5)  # threshold 1 s
    release = threading.Event()
    crowd, _ = _reads({})  # numbers the reads

    def slow_together() -> int:
        n = crowd()
        release.wait(20)  # four reads slow together (a busy store): held until released together
        return n

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        start = time.perf_counter()
        together = [pool.submit(hedger.call, slow_together, 100) for _ in range(4)]
        deadline = time.monotonic() + 10
        while hedger._overdue < 4 and time.monotonic() < deadline:  # all four past their hedge time (1 s)
            time.sleep(0.01)
        # A late read not overtaken would be hedged at twice its threshold (2 s); four late together
        # only at four times it (4 s). Look in between: with a wide margin either way on a loaded machine.
        time.sleep(max(0.0, start + 2.5 - time.perf_counter()))
        overdue, hedged_while_late = hedger._overdue, hedger.stats.hedged
        release.set()
        assert len({f.result() for f in together}) == 4
        assert overdue == 4 and hedged_while_late == 0  # a busy store: nobody overtaken, no second requests
        # (Released together, they finish within microseconds; which finish first, and whether the
        # last of them is then overtaken, is the scheduler's: hedges from here on are not counted.)
        assert hedger._overdue == 0 and hedger._in_flight == 0  # the crowd is gone with its reads
        hedger.history.recent.clear()
        hedger.history.by_class.clear()
        for _ in range(2):
            hedger._record(100, 0.1)  # threshold 200 ms again
        hedged = hedger.stats.hedged
        fn, _ = _reads({0: 2.0})
        straggler = pool.submit(hedger.call, fn, 100)  # 2 s, the only read in flight
        assert straggler.result() == 1 and hedger.stats.hedged == hedged + 1  # hedged alone; the hedge won


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
    release = threading.Event()
    fn, calls = _reads({}, held=(6, 7), release=release)  # the 7th read stalls, and so does its hedge
    try:
        results = [hedger.call(fn, 1 << 20) for _ in range(8)]
        assert not release.is_set()  # answered while both stragglers were still out
    finally:
        release.set()
    assert results[6] == 8 and hedger.stats.hedged == 2 and hedger.stats.won == 1


def test_a_size_with_few_reads_of_its_own_is_estimated_from_reads_of_about_its_size():
    hedger = Hedger(HedgePolicy(k=3, floor_ms=10, min_history=8, cold_ms=2000))
    for _ in range(4):
        hedger._record(100, 0.05)  # indexes: a round trip each
        hedger._record(3 << 19, 0.02)  # 1.5 MiB pieces
    # A 2.25 MiB piece (a size class with no history): from the 1.5 MiB reads scaled up, not from
    # the round trips scaled x36 (which would put it at cold_ms).
    assert hedger.threshold_s(9 << 18) == pytest.approx(3 * 0.02 * 1.5)
    # Its own class once it has min_history reads: k x their median, and never inside their tail
    # (where load spreads latencies past k x median, hedging the tail would spend the budget).
    for seconds in (0.01,) * 6 + (0.2, 0.2):
        hedger._record(9 << 18, seconds)
    assert hedger.threshold_s(9 << 18) == pytest.approx(0.2)  # the 90th percentile, not 3 x 10 ms


def test_one_hedger_per_store_and_policy_in_a_process():
    from dataio.storage.hedge import shared_hedger

    policy = HedgePolicy()
    assert shared_hedger("test|shared", policy) is shared_hedger("test|shared", policy)
    assert shared_hedger("test|shared", policy) is not shared_hedger("test|other", policy)
    assert shared_hedger("test|shared", HedgePolicy(k=4)) is not shared_hedger("test|shared", policy)
    assert shared_hedger("test|shared", HedgePolicy(k=4)).history is shared_hedger("test|shared", policy).history


def test_a_read_started_under_the_cold_prior_is_hedged_once_history_arrives():
    # The first reads of a process start with no history (threshold cold_ms); the reads that finish
    # meanwhile lower the threshold, and a waiting straggler is hedged then, not at cold_ms.
    hedger = Hedger(HedgePolicy(k=3, floor_ms=20, small_floor_ms=20, min_history=2, cold_ms=3_600_000))
    hedger._record(100, 0.01)  # the client is ready; one read so far
    hedger.history.recent.clear()
    hedger.history.by_class.clear()
    release = threading.Event()
    fn, _ = _reads({}, held=(0,), release=release)  # the first read stalls
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(hedger.call, fn, 100)
        time.sleep(0.2)
        for _ in range(3):
            hedger._record(100, 0.01)  # other reads finish in 10 ms: the threshold drops to 30 ms
        try:
            # The hedge answers while the stalled read still waits: hedged once the history came,
            # not at cold_ms (an hour here), nor left to run out (it would answer 0).
            assert stalled.result(timeout=STRAGGLER_S) == 1
        finally:
            release.set()
    assert hedger.stats.hedged == 1
