"""Hedged ranged reads: a read much slower than its peers gets a second request; the first wins.

Object stores have stragglers: one request in many waits seconds while the rest take tens of
milliseconds. A ranged read still running after `k` times the recent median for its size (at
least a floor in ms, lower for small reads) gets a second, identical request; whichever finishes
first is used and the other is abandoned (its thread ends when its request does; nothing waits
for it). Hedges are bounded by a budget, a share of all requests, so a store that is slow
everywhere is not asked twice for everything. Counters are per process; loader workers report them with each batch.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import TypeVar

from dataio.storage import threads

T = TypeVar("T")

THREAD_NAME_PREFIX = "dataio-hedge"
HISTORY = 64  # recent latencies kept per size class
SMALL_BYTES = 64 << 10  # reads up to this size cost about one round trip: scaled as this size
CROWD = 8  # late reads wait longer while more than 2 of them, and 1 in CROWD of the reads in flight, are late
TAIL_QUANTILE = 0.9  # a read is not hedged before this quantile of its size class's recent latencies
RECHECK_S = 0.1  # a waiting read's hedge time is computed again at least this often
NEAR = 4  # reads within this factor of a size estimate its time when its own class has too few
LARGE_BYTES = 16 << 20  # reads from this size on (a reader's largest pieces) get the whole floor_ms


@dataclass(frozen=True, kw_only=True, slots=True)
class HedgePolicy:
    """When a ranged read gets a second request: after max(k x recent median for its size, the floor
    for its size), while hedges stay within budget_fraction of requests (plus `burst` to start with).
    The floor is small_floor_ms for reads up to 64 KiB (indexes, sidecars, HEADs: one round trip)
    and grows with the size up to floor_ms at 16 MiB: a small request is hedged sooner, since its
    median is milliseconds and the reads of a shard's start all wait for it."""

    k: float = 3.0
    floor_ms: float = 200.0
    small_floor_ms: float = 50.0
    budget_fraction: float = 0.1
    burst: int = 2
    min_history: int = 8  # latencies needed before their median sets a size class's threshold
    # Before that, a read is hedged after cold_ms (None: never): a prior, since a read slower
    # than a second is a straggler on any store fast enough to feed training, and a worker's
    # first reads (indexes, first windows) are the ones everything else waits for.
    cold_ms: float | None = 1000.0
    max_hedges: int = 2  # a hedge still slow after the threshold gets another, up to this many per read

    def __post_init__(self) -> None:
        if not self.k >= 1.0:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.floor_ms >= 0 or not self.small_floor_ms >= 0:
            raise ValueError(f"floor_ms and small_floor_ms must be >= 0, got {self.floor_ms}, {self.small_floor_ms}")
        if not 0.0 <= self.budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in [0, 1], got {self.budget_fraction}")
        if self.cold_ms is not None and not self.cold_ms >= 0:
            raise ValueError(f"cold_ms must be >= 0 or None, got {self.cold_ms}")
        if self.max_hedges < 1:
            raise ValueError(f"max_hedges must be >= 1, got {self.max_hedges}")
        if self.burst < 0 or self.min_history < 1:
            raise ValueError("burst must be >= 0 and min_history >= 1")

    def floor_s(self, size: int) -> float:
        """The least hedge threshold of a read of `size` bytes: small_floor_ms (at most floor_ms) up to
        SMALL_BYTES, growing in proportion to the size up to floor_ms at LARGE_BYTES."""
        low = min(self.small_floor_ms, self.floor_ms)
        share = min(1.0, max(0.0, (size - SMALL_BYTES) / (LARGE_BYTES - SMALL_BYTES)))
        return (low + (self.floor_ms - low) * share) / 1000


@dataclass(slots=True)
class HedgeStats:
    """Counters of one process's hedged reads."""

    requests: int = 0  # ranged reads that went through a Hedger
    hedged: int = 0  # of them, how many got a second request
    won: int = 0  # of those, how many the second request finished first
    over_budget: int = 0  # slow reads left alone because the budget was spent

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "hedged": self.hedged, "won": self.won, "over_budget": self.over_budget}


_STATS = HedgeStats()
_STATS_PID = os.getpid()
_STATS_LOCK = threading.Lock()


def _own_stats() -> HedgeStats:
    """This process's counters (a forked worker starts from zero, not from its parent's); hold the lock."""
    global _STATS, _STATS_PID
    if _STATS_PID != os.getpid():
        _STATS, _STATS_PID = HedgeStats(), os.getpid()
    return _STATS


def process_stats() -> HedgeStats:
    """A copy of this process's counters (every Hedger of the process adds to them)."""
    with _STATS_LOCK:
        s = _own_stats()
        return HedgeStats(s.requests, s.hedged, s.won, s.over_budget)


class LatencyHistory:
    """Recent read latencies of one store as seen from this process: per size class (bit length
    of the size) and, for sizes seen too rarely, the recent (size, seconds) of every read."""

    def __init__(self) -> None:
        self.by_class: dict[int, deque[float]] = {}
        self.recent: deque[tuple[int, float]] = deque(maxlen=HISTORY)
        self.lock = threading.Lock()

    def add(self, size: int, seconds: float) -> None:
        with self.lock:
            self.by_class.setdefault(max(0, size).bit_length(), deque(maxlen=HISTORY)).append(seconds)
            self.recent.append((max(0, size), seconds))

    def copy(self) -> LatencyHistory:
        """The same latencies with a fresh lock (for a forked child: the parent's lock may be held)."""
        out = LatencyHistory()
        out.by_class = {c: deque(d, maxlen=HISTORY) for c, d in self.by_class.items()}
        out.recent = deque(self.recent, maxlen=HISTORY)
        return out


_HISTORIES: dict[str, LatencyHistory] = {}
_HISTORIES_PID = os.getpid()
_HISTORIES_LOCK = threading.Lock()


def shared_history(store_key: str) -> LatencyHistory:
    """This process's latency history of one store (endpoint), shared by its Stores: a new loader
    on the same store starts from what the last one learned, and a forked worker from its parent's."""
    global _HISTORIES, _HISTORIES_PID
    with _HISTORIES_LOCK:
        if _HISTORIES_PID != os.getpid():  # the only thread of a new child: copying is safe
            _HISTORIES, _HISTORIES_PID = {k: h.copy() for k, h in _HISTORIES.items()}, os.getpid()
        return _HISTORIES.setdefault(store_key, LatencyHistory())


class Hedger:
    """Runs ranged reads with a hedge; thread-safe, one per store (endpoint) and policy per process
    (shared_hedger): the budget, and which reads are late, are judged over all of its reads."""

    def __init__(self, policy: HedgePolicy, history: LatencyHistory | None = None) -> None:
        self.policy = policy
        self.stats = HedgeStats()
        self.history = history if history is not None else LatencyHistory()
        self._lock = threading.Lock()
        # When the first read of this process finished. Reads started before it share the
        # client's start-up (session, credentials, connections): only their time after it is
        # recorded (the first read's not at all), and a cold read's clock starts here.
        self._ready_at: float | None = None
        # A straggler is slow while the store answers others: a read is hedged once a read that
        # started after it has finished (or when it is alone), else only at twice its threshold
        # (the last read of a burst has no younger one); not while many reads are slow together
        # (a busy store or machine), where a second request for each only adds load.
        self._started = 0  # reads started so far (each read's number is its place in this count)
        self._newest_done = -1  # the highest number of a finished read
        self._in_flight = 0
        # Reads past their hedge time and not finished: when many are late at once (more than two
        # and 1 in CROWD of those in flight), the store or the machine is slow for all: they are
        # hedged only past 4x their threshold (or once fewer are late).
        self._overdue = 0

    def threshold_s(self, size: int) -> float | None:
        """Seconds after which a read of `size` bytes is hedged: k x its size class's recent median (at
        least the class's 90th percentile); for a size seen too rarely, k x an upper estimate from
        reads of about its size, else from other sizes (at most cold_ms); cold_ms while there is no
        history at all (None: not hedged). Never below the floor for the size."""
        p = self.policy
        cold_s = None if p.cold_ms is None else max(p.cold_ms, p.floor_ms) / 1000
        h = self.history
        with h.lock:
            own = h.by_class.get(max(0, size).bit_length())
            if own is not None and len(own) >= p.min_history:
                # Past the class's own tail too (its 90th percentile): where load alone spreads
                # latencies past k x median, hedging that tail would spend the budget the
                # stragglers need (a true straggler, 1 in 20 or fewer, stays above it).
                tail = sorted(own)[int(TAIL_QUANTILE * (len(own) - 1))]
                return max(p.k * statistics.median(own), tail, p.floor_s(size))
            # Other sizes' reads bound this one from above: a few (half min_history, at least 3,
            # a median still robust to one straggler) are enough.
            few = max(3, p.min_history // 2)
            if not h.recent:
                return cold_s
            # Each recent read scaled up to this size as if time grew with bytes (it grows less:
            # part of it is the round trip), and a larger read's time as is: an upper estimate.
            # Reads of about this size (within NEAR x either way) first, when there are a few: scaled
            # from far smaller reads (an index to a 2 MB piece: x32), the round trip alone would set
            # the threshold at cold_ms. With fewer than `few` reads at all, the slowest of them.
            want = max(size, SMALL_BYTES)
            near = [(n, t) for n, t in h.recent if want / NEAR <= max(n, SMALL_BYTES) <= want * NEAR]
            pool = near if len(near) >= few else h.recent
            scaled = [t * max(1.0, want / max(n, SMALL_BYTES)) for n, t in pool]
            estimate = statistics.median(scaled) if len(scaled) >= few else max(scaled)
        threshold = p.k * estimate if cold_s is None else min(p.k * estimate, cold_s)
        return max(threshold, p.floor_s(size))

    def _record(self, size: int, seconds: float, started: float | None = None) -> None:
        with self._lock:
            now = time.perf_counter()
            if self._ready_at is None:
                self._ready_at = now
                if started is not None:
                    return  # the first read: mostly the client's start
            elif started is not None and started < self._ready_at:
                # Started while the client started: it waited for the client, then was served;
                # only the time since the client was ready says how fast the store answers.
                seconds = now - self._ready_at
        self.history.add(size, seconds)

    def _hedge_at(self, size: int, started: float) -> float | None:
        """perf_counter time at which a read started at `started` gets its hedge; inf: never; None: not
        known yet (nothing has finished: the client is still starting)."""
        threshold = self.threshold_s(size)
        if threshold is None:
            return float("inf")
        ready = self._ready_at
        return None if ready is None else max(started, ready) + threshold

    def _may_hedge(self) -> bool:
        p = self.policy
        with self._lock:
            return self.stats.hedged < p.burst + p.budget_fraction * self.stats.requests

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + n)
        with _STATS_LOCK:
            stats = _own_stats()
            for name, n in deltas.items():
                setattr(stats, name, getattr(stats, name) + n)

    def call(self, fn: Callable[[], T], size: int) -> T:
        """fn(), with a second fn() started if the first is slow; the first result (or the last error) wins."""
        self._count(requests=1)
        with self._lock:
            number = self._started
            self._started += 1
            self._in_flight += 1
        overdue = [False]  # set by _slow once this read is past its hedge time
        try:
            return self._call(fn, size, number, overdue)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._newest_done = max(self._newest_done, number)
                self._overdue -= overdue[0]
                self._ready_at = self._ready_at or time.perf_counter()  # a failed first read too

    def _call(self, fn: Callable[[], T], size: int, number: int, overdue: list[bool]) -> T:
        start = time.perf_counter()
        if self._hedge_at(size, start) == float("inf"):
            result = fn()
            self._record(size, time.perf_counter() - start, start)
            return result
        pool = threads.pool(THREAD_NAME_PREFIX)  # threads kept between reads; the losers run out on their own
        first = pool.submit(fn)
        if not self._slow(first, size, start, number, overdue) or not self._may_hedge():
            if not first.done():
                self._count(over_budget=1)
            result = first.result()
            self._record(size, time.perf_counter() - start, start)
            return result
        starts = {first: start}
        winner = self._race(pool, fn, size, starts)
        if winner is not first:
            self._count(won=1)
        self._record(size, time.perf_counter() - starts[winner], starts[winner])
        return winner.result()

    def _race(self, pool: threads.ElasticPool, fn: Callable[[], T], size: int,
              starts: dict[Future[T], float]) -> Future[T]:
        """Hedge, and hedge again while every request so far is slow (a hedge meets stragglers too),
        up to max_hedges and within budget. The first success wins; if all fail, the last to fail."""
        while True:
            self._count(hedged=1)
            starts[pool.submit(fn)] = time.perf_counter()
            threshold = self.threshold_s(size) if len(starts) <= self.policy.max_hedges else None
            deadline = None if threshold is None else time.perf_counter() + threshold
            while True:
                winner = _settled(starts)
                if winner is not None:
                    return winner
                timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
                done, _ = wait([f for f in starts if not f.done()], timeout=timeout, return_when=FIRST_COMPLETED)
                if not done and deadline is not None:
                    if self._may_hedge():
                        break  # all still running past the threshold: another request
                    self._count(over_budget=1)
                    deadline = None

    def _slow(self, first: Future[T], size: int, start: float, number: int, overdue: list[bool]) -> bool:
        """Wait for read `number` (`first`) until it is a straggler (past its hedge time and overtaken
        by a younger read or alone, or past twice its threshold, and not one of many late together);
        True if it is one, False once it has finished."""
        while True:
            at = self._hedge_at(size, start)
            now = time.perf_counter()
            # Until some read has finished, or once past the hedge time but not a straggler yet,
            # look again every 50 ms; before it, at least every RECHECK_S: the first reads of a
            # process start under the cold prior, and the history that arrives meanwhile lowers it.
            timeout = 0.05 if at is None or now >= at else min(at - now, RECHECK_S)
            done, _ = wait([first], timeout=timeout)
            if done:
                return False  # _record (or, if it failed, call) marks the client ready
            if at is not None and time.perf_counter() >= at:
                threshold = at - max(start, self._ready_at or start)
                with self._lock:
                    if not overdue[0]:
                        overdue[0] = True
                        self._overdue += 1
                    overtaken = self._newest_done > number or self._in_flight == 1
                    # Late with few others (two stragglers at once happen), not with a crowd: when
                    # many reads are late together the store or the machine is slow for all, and a
                    # second request for each would only add load (and spend the budget).
                    few_late = self._overdue <= 2 or CROWD * (self._overdue - 1) < self._in_flight
                # Past twice its threshold a read is a straggler even if no younger read overtook
                # it (the last reads of a burst have none); among many late reads, past 4x (some
                # of them are stragglers all the same: 3 stalls at once happen at 5%).
                late_s = time.perf_counter() - at
                if (few_late and (overtaken or late_s >= threshold)) or late_s >= 3 * threshold:
                    return True


def _settled(futures: dict[Future[T], float]) -> Future[T] | None:
    """The first (in start order) finished without an error; else, once all finished, the last one; else None."""
    finished = [f for f in futures if f.done()]
    for f in finished:
        if f.exception() is None:
            return f
    return finished[-1] if len(finished) == len(futures) else None


_HEDGERS: dict[tuple[str, HedgePolicy], Hedger] = {}
_HEDGERS_PID = os.getpid()
_HEDGERS_LOCK = threading.Lock()


def shared_hedger(store_key: str, policy: HedgePolicy) -> Hedger:
    """This process's Hedger of one store (endpoint) under `policy`, shared by its Stores (every
    reader thread and every loader of the process); a forked child makes its own (on the history
    copied from its parent's)."""
    global _HEDGERS, _HEDGERS_PID
    with _HEDGERS_LOCK:
        if _HEDGERS_PID != os.getpid():
            _HEDGERS, _HEDGERS_PID = {}, os.getpid()
        hedger = _HEDGERS.get((store_key, policy))
        if hedger is None:
            hedger = _HEDGERS[store_key, policy] = Hedger(policy, shared_history(store_key))
        return hedger
