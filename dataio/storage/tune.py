"""Part size and parts in flight of S3 reads into a buffer, from the throughput measured per endpoint.

The CRT client's idea, kept small: StorageOptions.part_bytes and parts_in_flight are the caps (a read
never asks for more than the user allowed). The parts in flight are the process's, across all its reads
of the endpoint (a gate, `slot`): the RAW path reads several window pieces at once, and each receiving
connection costs CPU (on loopback at 2 cores, 8 bodies at once cost 0.59-0.83 CPU-s/GB against
0.47-0.55 for 2, at about the same rate: the kernel copies from colder socket buffers, more threads wake). The first reads
go START_IN_FLIGHT at once; after each round (as many finished parts as were allowed in flight) the
tuner compares the total throughput at this level (a request's rate times the level) with the levels
around it:
- an error (a part that gave up) or a stall (a part slower than STALL_FACTOR x its expected time) in the
  round halves the parts in flight (a struggling server gets fewer requests at once, not more retries);
- one fewer where this level's extra request adds less than GAIN_SHARE of a request's average share
  over the level below: more requests only share the link (or the cores) out;
- else one more, up to the cap, unless the level above is known to add less than that.
Rates measured at a level are forgotten after FORGET_S, so a level that was slow once is tried again.
Parts are sized to take about TARGET_PART_S at the measured per-request rate, between MIN_PART_BYTES
and the cap: on a slow link a hedge or a retry then repeats a small part, not 8 MiB.
The policy is a pure class over an injected clock (tests drive it without a network). Hedges of a
part run beside the gate (a straggler's second request must start at once; the hedge budget bounds
them), and with adapt_parts off there is no gate: parts_in_flight is then per read.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dataio.storage.options import StorageOptions

STALL_FACTOR = 4.0
FORGET_S = 30.0
TARGET_PART_S = 0.25
MIN_PART_BYTES = 1 << 20
EWMA = 0.5  # weight of a new round's rate in its level's
START_IN_FLIGHT = 2  # the first reads' parts in flight (at most the cap): more once more measure a gain
# A request is worth adding if it brings at least this share of what each request brings on average:
# level k + 1 is kept if its total throughput is at least (1 + GAIN_SHARE / k) x level k's (a link that
# is not full gains 1 / k; a full link or busy cores gain nothing, and noise of a few % does not count).
GAIN_SHARE = 0.5
GATE_RECHECK_S = 0.1  # a part waiting for its slot looks at its read's cancel flag this often


@dataclass(frozen=True, kw_only=True, slots=True)
class PartPlan:
    """How one read is cut: parts of about part_bytes, up to in_flight of them at once."""

    part_bytes: int
    in_flight: int


class PartTuner:
    """One endpoint's part size and parts in flight, adapted from finished parts (thread-safe)."""

    def __init__(self, *, max_part_bytes: int, max_in_flight: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_part_bytes < 1 or max_in_flight < 1:
            raise ValueError(f"caps must be >= 1, got part bytes {max_part_bytes}, in flight {max_in_flight}")
        self.max_part_bytes, self.max_in_flight, self.clock = max_part_bytes, max_in_flight, clock
        self._lock = threading.Lock()
        self._gate = threading.Condition(self._lock)
        self._active = 0  # parts holding a slot
        self._in_flight = min(START_IN_FLIGHT, max_in_flight)
        self._rates: dict[int, tuple[float, float]] = {}  # level -> (bytes/s per request, measured at)
        self._round: list[tuple[int, float]] = []  # (bytes, seconds) of this round's finished parts
        self._trouble = False

    def plan(self) -> PartPlan:
        """The cut for the next read."""
        with self._lock:
            rate = self._rate(self._in_flight)
            floor = min(MIN_PART_BYTES, self.max_part_bytes)
            size = self.max_part_bytes if rate is None else int(min(self.max_part_bytes,
                                                                    max(floor, rate * TARGET_PART_S)))
            return PartPlan(part_bytes=size, in_flight=self._in_flight)

    @contextlib.contextmanager
    def slot(self, cancel: threading.Event) -> Iterator[bool]:
        """Held while one part is read: at most `in_flight` parts of this process's reads at once. Yields
        False, holding nothing, if `cancel` was set while it waited."""
        with self._gate:
            while self._active >= self._in_flight and not cancel.is_set():
                self._gate.wait(GATE_RECHECK_S)
            holding = self._active < self._in_flight
            self._active += holding
        if not holding:
            yield False
            return
        try:
            yield True
        finally:
            with self._gate:
                self._active -= 1
                self._gate.notify()

    def finished(self, num_bytes: int, seconds: float) -> None:
        """A part came in whole after `seconds` (its retries and hedges included)."""
        with self._lock:
            expected = self._expected_s(num_bytes)
            if expected is not None and seconds > STALL_FACTOR * expected:
                self._trouble = True
            self._round.append((num_bytes, max(seconds, 1e-6)))
            self._maybe_step()

    def failed(self) -> None:
        """A part gave up (its error is the read's): fewer parts in flight from the next read on."""
        with self._lock:
            self._trouble = True
            self._round.append((0, 0.0))
            self._maybe_step()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def _rate(self, level: int) -> float | None:
        found = self._rates.get(level)
        if found is None or self.clock() - found[1] > FORGET_S:
            return None
        return found[0]

    def _expected_s(self, num_bytes: int) -> float | None:
        rate = self._rate(self._in_flight)
        return None if rate is None else num_bytes / rate

    def _maybe_step(self) -> None:
        if len(self._round) < self._in_flight:
            return
        done = [(b, s) for b, s in self._round if b]
        level, self._round = self._in_flight, []
        if done:
            rate = sum(b for b, _ in done) / sum(s for _, s in done)  # a slow part weighs its time
            old = self._rate(level)
            self._rates[level] = (rate if old is None else EWMA * rate + (1 - EWMA) * old, self.clock())
        if self._trouble:
            self._trouble = False
            self._in_flight = max(1, level // 2)
            return
        here, above = self._total(level), self._total(level + 1)
        below = self._total(level - 1) if level > 1 else None
        if here is None:
            return
        if below is not None and here < below * (1 + GAIN_SHARE / (level - 1)):
            self._in_flight = level - 1  # the extra request only shares the link (or the cores) out
        elif level < self.max_in_flight and (above is None or above >= here * (1 + GAIN_SHARE / level)):
            self._in_flight = level + 1
            self._gate.notify_all()  # a part waiting for a slot has one now

    def _total(self, level: int) -> float | None:
        """Bytes/s of `level` requests at once (each one's measured rate times the level)."""
        rate = self._rate(level)
        return None if rate is None else rate * level


_TUNERS: dict[tuple[int, str | None, int, int], PartTuner] = {}
_LOCK = threading.Lock()


def tuner_for(options: StorageOptions) -> PartTuner:
    """This process's tuner for the options' endpoint and caps."""
    key = (os.getpid(), options.endpoint_url, options.part_bytes, options.parts_in_flight)
    with _LOCK:
        found = _TUNERS.get(key)
        if found is None:
            if any(k[0] != key[0] for k in _TUNERS):  # a forked child measures for itself
                _TUNERS.clear()
            found = _TUNERS[key] = PartTuner(max_part_bytes=options.part_bytes, max_in_flight=options.parts_in_flight)
        return found
