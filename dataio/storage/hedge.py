"""Hedged ranged reads: a read much slower than its peers gets a second request; the first wins.

Object stores have stragglers: one request in many waits seconds while the rest take tens of
milliseconds. A ranged read still running after `k` times the recent median for its size (at
least `floor_ms`) gets a second, identical request; whichever finishes first is used and the
other is abandoned (its thread ends when its request does; nothing waits for it). Hedges are
bounded by a budget, a share of all requests, so a store that is slow everywhere is not asked
twice for everything. Counters are per process; loader workers report them with each batch.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

THREAD_NAME_PREFIX = "dataio-hedge"
HISTORY = 64  # recent latencies kept per size class


@dataclass(frozen=True, kw_only=True, slots=True)
class HedgePolicy:
    """When a ranged read gets a second request: after max(k x recent median for its size, floor_ms),
    while hedges stay within budget_fraction of requests (plus `burst` to start with)."""

    k: float = 3.0
    floor_ms: float = 200.0
    budget_fraction: float = 0.1
    burst: int = 2
    min_history: int = 8  # latencies of a size class needed before its reads are hedged

    def __post_init__(self) -> None:
        if not self.k >= 1.0:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.floor_ms >= 0:
            raise ValueError(f"floor_ms must be >= 0, got {self.floor_ms}")
        if not 0.0 <= self.budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in [0, 1], got {self.budget_fraction}")
        if self.burst < 0 or self.min_history < 1:
            raise ValueError("burst must be >= 0 and min_history >= 1")


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


class Hedger:
    """Runs ranged reads with a hedge; thread-safe, one per Store per process."""

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self.stats = HedgeStats()
        self._history: dict[int, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=HISTORY)
        self._lock = threading.Lock()

    def threshold_s(self, size: int) -> float | None:
        """Seconds after which a read of `size` bytes is hedged; None while its size class has too little history."""
        with self._lock:
            recent = self._history.get(max(0, size).bit_length())
            if recent is None or len(recent) < self.policy.min_history:
                recent = self._all  # a size class seen too rarely: the median over every size
            if len(recent) < self.policy.min_history:
                return None
            median = statistics.median(recent)
        return max(self.policy.k * median, self.policy.floor_ms / 1000)

    def _record(self, size: int, seconds: float) -> None:
        with self._lock:
            self._history.setdefault(max(0, size).bit_length(), deque(maxlen=HISTORY)).append(seconds)
            self._all.append(seconds)

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
        threshold = self.threshold_s(size)
        start = time.perf_counter()
        if threshold is None:
            result = fn()
            self._record(size, time.perf_counter() - start)
            return result
        pool = ThreadPoolExecutor(2, thread_name_prefix=THREAD_NAME_PREFIX)
        try:
            first = pool.submit(fn)
            done, _ = wait([first], timeout=threshold)
            if done or not self._may_hedge():
                if not done:
                    self._count(over_budget=1)
                result = first.result()
                self._record(size, time.perf_counter() - start)
                return result
            self._count(hedged=1)
            hedge_start = time.perf_counter()
            second = pool.submit(fn)
            winner = _first_success([first, second])
            if winner is second:
                self._count(won=1)
                self._record(size, time.perf_counter() - hedge_start)
            else:
                self._record(size, time.perf_counter() - start)
            return winner.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # the loser runs out on its own


def _first_success(futures: list[Future[T]]) -> Future[T]:
    """The first future to finish without an error; if all fail, the last to fail."""
    pending = set(futures)
    last: Future[T] | None = None
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for f in done:
            if f.exception() is None:
                return f
            last = f
    assert last is not None
    return last
