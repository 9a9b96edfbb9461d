"""Fetch requests ahead of use in background threads, within a byte budget, in request order.

Object-storage latency is hidden by keeping up to `max_in_flight` fetches running while the
consumer parses and decodes. Where the consumer does not care about order inside a group of
consecutive requests (a shuffle window is used only once all its pieces are in), `group` lets
a group's results come as they finish: one straggling request then holds one slot, not the
whole pipeline behind it. Bytes count against the budget from submission until the
consumer comes back for the next result (so the one it holds counts too); a request bigger
than the whole budget still runs, alone. Threads live only while a `run` is being iterated:
closing the generator (explicitly, by `close()`, or by garbage collection) cancels what has
not started and joins the rest.

`first_budget_bytes` starts the budget lower (what the consumer needs first, e.g. its first
shuffle window) and doubles it with every result the consumer takes, up to `budget_bytes`: the
first result does not share the store's bandwidth (and the CPU) with a whole budget of reads
ahead, and the budget is back to full after a few results.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

THREAD_NAME_PREFIX = "dataio-prefetch"


class Prefetcher(Generic[T, R]):
    """Fetch requests ahead of use in background threads, within a memory budget; yield results in request order."""

    def __init__(
        self,
        fetch: Callable[[T], R],
        *,
        size_of: Callable[[T], int],
        budget_bytes: int,
        max_in_flight: int = 8,
        first_budget_bytes: int | None = None,
    ) -> None:
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if first_budget_bytes is not None and first_budget_bytes < 1:
            raise ValueError(f"first_budget_bytes must be positive, got {first_budget_bytes}")
        self.first_budget_bytes = min(budget_bytes, first_budget_bytes or budget_bytes)
        self.fetch = fetch
        self.size_of = size_of
        self.budget_bytes = budget_bytes
        self.max_in_flight = max_in_flight
        self._runs: weakref.WeakSet[Generator] = weakref.WeakSet()

    def _timed(self, request: T) -> tuple[R, float]:
        start = time.perf_counter()
        result = self.fetch(request)
        return result, time.perf_counter() - start

    def run(
        self, requests: Iterable[T], *, group: Callable[[T], Hashable] | None = None
    ) -> Iterator[tuple[T, R, float]]:
        """(request, result, fetch_seconds) in request order; a fetch's exception is raised at its place.
        With `group`, consecutive requests of one group come in the order they finish (groups in order)."""
        gen = self._run(iter(requests), group)
        self._runs.add(gen)
        return gen

    def _run(
        self, requests: Iterator[T], group: Callable[[T], Hashable] | None
    ) -> Generator[tuple[T, R, float], None, None]:
        pending: deque[tuple[T, Future[tuple[R, float]], int]] = deque()
        pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix=THREAD_NAME_PREFIX)
        in_flight_bytes = 0
        budget = self.first_budget_bytes  # doubles with each result taken, up to budget_bytes
        waiting: list[tuple[T, int]] = []  # the next request, sized but not yet admitted
        exhausted = False
        try:
            while True:
                while len(pending) < self.max_in_flight and not exhausted:
                    if not waiting:
                        try:
                            request = next(requests)
                        except StopIteration:
                            exhausted = True
                            break
                        waiting.append((request, max(0, int(self.size_of(request)))))
                    request, size = waiting[0]
                    if pending and in_flight_bytes + size > budget:
                        break  # wait for the consumer to release bytes; alone it may exceed
                    waiting.pop()
                    pending.append((request, pool.submit(self._timed, request), size))
                    in_flight_bytes += size
                if not pending:
                    return
                request, future, size = _next_done(pending, group)
                result, seconds = future.result()
                del future
                yield request, result, seconds
                del result
                in_flight_bytes -= size
                budget = min(self.budget_bytes, 2 * budget)
        finally:
            for _, future, _ in pending:
                future.cancel()
            pending.clear()
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop every run of this prefetcher (from the consuming thread): pending fetches cancelled, threads joined."""
        for gen in list(self._runs):
            gen.close()


def _next_done(pending: deque[tuple[T, Future[R], int]], group: Callable[[T], Hashable] | None) -> tuple[T, Future[R], int]:
    """Take the head of `pending`; with `group`, the first finished entry of the head's group (waiting for one)."""
    if group is None or len(pending) == 1:
        return pending.popleft()
    head = group(pending[0][0])
    same = 1  # the head's group is a run at the front of the queue
    while same < len(pending) and group(pending[same][0]) == head:
        same += 1
    while True:
        for i in range(same):
            if pending[i][1].done():
                entry = pending[i]
                del pending[i]
                return entry
        wait([pending[i][1] for i in range(same)], return_when=FIRST_COMPLETED)
