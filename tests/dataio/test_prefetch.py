"""Prefetcher: order, byte budget, errors in place, clean early stop, overlapped latency."""

from __future__ import annotations

import gc
import random
import threading
import time

import pytest

from dataio.storage.prefetch import THREAD_NAME_PREFIX, Prefetcher

pytestmark = pytest.mark.timeout(60)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME_PREFIX)]


class Ledger:
    """An instrumented fetch: counts bytes alive (fetch started, consumer not yet done) at once."""

    def __init__(self, sizes: dict[int, int], delay_s: float = 0.0) -> None:
        self.sizes, self.delay_s = sizes, delay_s
        self.lock = threading.Lock()
        self.alive_bytes = self.max_alive_bytes = 0
        self.alive: set[int] = set()
        self.overlaps: list[set[int]] = []

    def fetch(self, i: int) -> str:
        with self.lock:
            self.alive_bytes += self.sizes[i]
            self.alive.add(i)
            self.max_alive_bytes = max(self.max_alive_bytes, self.alive_bytes)
            self.overlaps.append(set(self.alive))
        time.sleep(self.delay_s * random.random())
        return f"r{i}"

    def done(self, i: int) -> None:
        with self.lock:
            self.alive_bytes -= self.sizes[i]
            self.alive.discard(i)


def test_results_come_in_request_order_with_their_fetch_time():
    ledger = Ledger({i: 1 for i in range(30)}, delay_s=0.01)
    pf = Prefetcher(ledger.fetch, size_of=lambda i: 1, budget_bytes=100, max_in_flight=6)
    out = list(pf.run(range(30)))
    assert [r for r, _, _ in out] == list(range(30))
    assert [res for _, res, _ in out] == [f"r{i}" for i in range(30)]
    assert all(s >= 0 for _, _, s in out)
    assert prefetch_threads() == []


def test_budget_bounds_bytes_alive_at_once():
    rng = random.Random(3)
    sizes = {i: rng.randint(1, 40) for i in range(60)}
    ledger = Ledger(sizes, delay_s=0.005)
    pf = Prefetcher(ledger.fetch, size_of=sizes.__getitem__, budget_bytes=100, max_in_flight=8)
    for request, _, _ in pf.run(range(60)):
        time.sleep(0.001)  # the consumer works while fetches run
        ledger.done(request)
    assert 40 <= ledger.max_alive_bytes <= 100
    assert max(len(s) for s in ledger.overlaps) > 1  # it did run ahead


def test_first_budget_reads_the_first_requests_alone_then_doubles():
    sizes = {i: 10 for i in range(40)}
    ledger = Ledger(sizes, delay_s=0.002)
    pf = Prefetcher(ledger.fetch, size_of=sizes.__getitem__, budget_bytes=160, max_in_flight=16,
                    first_budget_bytes=20)
    started_before: list[int] = []  # requests started (ever) when each result is taken
    for request, _, _ in pf.run(range(40)):
        with ledger.lock:
            started_before.append(len(ledger.overlaps))
        ledger.done(request)
    # The first two (the first window's 20 bytes) run alone; then 40, 80 and 160 bytes at most.
    assert started_before[0] <= 2
    assert started_before[1] <= 1 + 4 and started_before[2] <= 2 + 8
    assert ledger.max_alive_bytes <= 160 and max(len(s) for s in ledger.overlaps) > 4  # back to full
    with pytest.raises(ValueError):
        Prefetcher(ledger.fetch, size_of=sizes.__getitem__, budget_bytes=10, first_budget_bytes=0)


def test_request_larger_than_budget_goes_alone():
    sizes = {0: 10, 1: 10, 2: 1000, 3: 10, 4: 10}
    ledger = Ledger(sizes, delay_s=0.01)
    pf = Prefetcher(ledger.fetch, size_of=sizes.__getitem__, budget_bytes=100, max_in_flight=4)
    got = []
    for request, _, _ in pf.run(range(5)):
        got.append(request)
        ledger.done(request)
    assert got == [0, 1, 2, 3, 4]
    assert all(s == {2} for s in ledger.overlaps if 2 in s)


def test_fetch_error_is_raised_at_its_position():
    def fetch(i: int) -> int:
        if i == 3:
            raise OSError("boom at 3")
        time.sleep(0.002)
        return i

    pf = Prefetcher(fetch, size_of=lambda i: 1, budget_bytes=10, max_in_flight=4)
    got = []
    with pytest.raises(OSError, match="boom at 3"):
        for request, result, _ in pf.run(range(10)):
            got.append(result)
    assert got == [0, 1, 2]
    assert prefetch_threads() == []


@pytest.mark.parametrize("how", ["break_and_close", "prefetcher_close", "garbage"])
def test_early_stop_joins_threads_and_cancels_the_rest(how):
    started: list[int] = []

    def fetch(i: int) -> int:
        started.append(i)
        time.sleep(0.02)
        return i

    pf = Prefetcher(fetch, size_of=lambda i: 1, budget_bytes=1000, max_in_flight=3)
    gen = pf.run(range(1000))
    assert next(gen)[0] == 0 and next(gen)[0] == 1
    if how == "break_and_close":
        gen.close()
    elif how == "prefetcher_close":
        pf.close()
    else:
        del gen
        gc.collect()
    assert prefetch_threads() == []
    assert len(started) <= 2 + 3  # only what was in flight ran, nothing more


def test_requests_run_ahead_of_the_consumer_and_overlap():
    # Overlap is shown by events, not elapsed time: the first six fetches wait at a barrier for each
    # other (a prefetcher that ran them one by one would break it at its deadline and raise), and
    # while the consumer holds result 0 the next requests are already in flight, unasked.
    delay_s, n, width = 0.05, 12, 6
    barrier = threading.Barrier(width)
    started: list[int] = []

    def fetch(i: int) -> int:
        started.append(i)
        if i < width:
            barrier.wait(timeout=30)
        time.sleep(delay_s)
        return i

    pf = Prefetcher(fetch, size_of=lambda i: 1, budget_bytes=1 << 20, max_in_flight=width)
    out = []
    for request, result, seconds in pf.run(range(n)):
        if request == 0:
            assert set(range(width)) <= set(started)  # requested before the consumer asked for them
        out.append((request, result, seconds))
    assert [r for r, _, _ in out] == list(range(n)) and [x for _, x, _ in out] == list(range(n))
    assert all(s >= delay_s for _, _, s in out)  # it reports (at least) the delay we injected
    assert not barrier.broken


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="budget_bytes"):
        Prefetcher(lambda i: i, size_of=lambda i: 1, budget_bytes=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        Prefetcher(lambda i: i, size_of=lambda i: 1, budget_bytes=1, max_in_flight=0)


@pytest.mark.slow
def test_prefetch_overlaps_s3_reads_through_the_delay_proxy(s3_server):
    from dataclasses import replace

    from dataio.readers.by_format import make_reader
    from dataio.storage.store import Store
    from tests.dataio.shardgen import Seg, write_tar_dataset
    from tools.delay_proxy import DelayProxy

    store = Store(f"s3://{s3_server.new_bucket()}/ds", s3_server.options())
    manifest, samples = write_tar_dataset(store, [6, 6, 6])
    segments = [Seg(shard, start, start + 2) for shard in range(3) for start in (0, 2, 4)] * 2
    width = 6
    barrier = threading.Barrier(width)  # the first six GETs meet: they were in flight together
    calls = [0]
    with DelayProxy(s3_server.endpoint_url, delay_s=0.1) as proxy:
        # No hedging here: on a loaded machine a 0.1 s read can look slow enough to hedge, and this
        # test counts one GET per segment (hedged reads have their own tests).
        slow = Store(store.raw_url, replace(s3_server.options(), endpoint_url=proxy.url, hedge=None))
        reader = make_reader(slow, manifest)
        for shard in range(3):
            reader.index(shard)  # indexes first: from here on one GET per segment
        before = proxy.stats.num_requests

        def fetch(seg: Seg) -> object:
            calls[0] += 1
            if calls[0] <= width:
                barrier.wait(timeout=30)
            return reader.fetch(seg)

        pf = Prefetcher(fetch, size_of=reader.payload_bytes, budget_bytes=1 << 20, max_in_flight=width)
        got = [reader.parse(seg, payload) for seg, payload, _ in pf.run(segments)]
        assert proxy.stats.num_requests - before == len(segments)
    assert got == [samples[s.shard][s.start : s.stop] for s in segments]
    assert not barrier.broken


def test_a_group_comes_in_finishing_order_so_a_straggler_holds_one_slot():
    slow = threading.Event()

    def fetch(req: tuple[int, int]) -> int:
        if req == (0, 1):
            slow.wait(5)  # a straggler in group 0
        else:
            time.sleep(0.01)
        return req[1]

    pf = Prefetcher(fetch, size_of=lambda r: 1, budget_bytes=100, max_in_flight=3)
    requests = [(0, i) for i in range(6)] + [(1, i) for i in range(6, 9)]
    out = []
    for request, _, _ in pf.run(requests, group=lambda r: r[0]):
        out.append(request)
        if len(out) == 5:
            slow.set()  # the other five of group 0 came past the straggler on 3 threads
    # the five quick ones finish on 3 threads in whatever order the scheduler gives; the straggler comes last
    assert sorted(out[:5]) == [(0, i) for i in (0, 2, 3, 4, 5)] and out[5] == (0, 1)
    assert sorted(out[6:]) == [(1, 6), (1, 7), (1, 8)]  # groups in order
    assert prefetch_threads() == []
