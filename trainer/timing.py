"""Per-step timing on one rank: data wait, host-to-device copy, compute, exposed/overlapped comm, optimizer.

Definitions (each step is one optimizer step, all its micro-steps included):
    wait_s          blocked in next() on the loader: loading that was NOT hidden
    h2d_s           host-to-device copy and input conversion
    compute_s       forward + backward, minus comm_exposed_s
    comm_exposed_s  after the last gradient bucket was ready, time backward still waited for all-reduce
    opt_s           optimizer step, scheduler step, zero_grad
    step_s          wall time of the whole step = the parts above + other (bookkeeping)
    comm_overlapped_s  all-reduce time that ran DURING backward: already inside compute_s, never add it
CPU: time.perf_counter. CUDA: events on the current stream, resolved at the end of each step
(one synchronize per step, the same cost as logging the loss).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

PHASES = ("wait", "h2d", "compute", "comm_exposed", "opt")


@dataclass(slots=True)
class StepRecord:
    """One optimizer step on one rank; times in seconds, start_s on the rank's wall clock."""

    step: int
    epoch: int
    start_s: float
    step_s: float
    wait_s: float
    h2d_s: float
    compute_s: float
    comm_exposed_s: float
    comm_overlapped_s: float
    opt_s: float
    samples: int
    read_s: float  # loader work for this step's batches (in its workers), from the batches
    decode_s: float
    slices: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, start_s, dur_s)

    @property
    def load_work_s(self) -> float:
        return self.read_s + self.decode_s

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "slices"}
        return out


class _Clock:
    """Marks on the host (perf_counter) or on the current CUDA stream (events)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return end - start
        return start.elapsed_time(end) / 1000.0


class CommHook:
    """A DDP communication hook timing each bucket's reduction, call -> completion.

    Without `inner` it all-reduces (mean) itself; with one (torch's fp16/bf16/PowerSGD hooks, or a
    user's) it calls that and times the future it returns, so the exposed/overlapped split holds
    for any hook.
    """

    def __init__(self, clock: _Clock, group: Any = None) -> None:
        self.clock, self.group = clock, group
        self.buckets: list[tuple[Any, list[Any]]] = []  # (call mark, [done mark]) per bucket

    def function(self, inner: Any = None):  # noqa: ANN201
        """The hook to pass to DDP.register_comm_hook(state, ...): a plain function, as DDP wants.
        `inner(state, bucket) -> Future` does the reduction when given; DDP passes it the state."""

        # No annotations on purpose: DDP checks them, and postponed (string) annotations fail its check.
        def timed_allreduce(state, bucket):  # noqa: ANN001, ANN202 - (state, GradBucket) -> Future[Tensor]
            called = self.clock.mark()
            done: list[Any] = []
            self.buckets.append((called, done))
            if inner is not None:
                fut = inner(state, bucket)
            else:
                tensor = bucket.buffer().div_(dist.get_world_size(self.group))
                fut = dist.all_reduce(tensor, group=self.group, async_op=True).get_future()

            def finish(f):  # noqa: ANN001, ANN202
                # For NCCL this runs with the current stream synced to the all-reduce: the event marks its end.
                done.append(self.clock.mark())
                value = f.value()
                return value[0] if isinstance(value, list) else value  # all_reduce's future holds [tensor]

            return fut.then(finish)

        return timed_allreduce

    def take(self) -> list[tuple[Any, list[Any]]]:
        out, self.buckets = self.buckets, []
        return out


class StepTimer:
    """Collects the phases of each step; `phase(name)` blocks are timed, comm comes from the hook."""

    def __init__(self, device: torch.device, *, keep_slices: int) -> None:
        self.clock = _Clock(device)
        self.hook = CommHook(self.clock)
        self.keep_slices = keep_slices
        self.anchor_wall_s, self.anchor_pc_s = time.time(), time.perf_counter()
        self._marks: list[tuple[str, Any, Any]] = []
        self._waits: list[tuple[float, float]] = []  # (perf_counter start, seconds) of each blocked next()
        self._comm: list[tuple[Any, list[Any], Any]] = []  # (first call, bucket list, backward end)
        self._step_start = 0.0
        self.buckets_per_step = 0  # gradient all-reduce calls in the last step that had any

    def wall(self, pc_s: float) -> float:
        """A perf_counter reading as seconds since the epoch (comparable across ranks via NTP)."""
        return self.anchor_wall_s + (pc_s - self.anchor_pc_s)

    def begin(self) -> None:
        self._marks, self._comm, self._waits = [], [], []
        self.hook.take()
        self._step_start = time.perf_counter()

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield the loader's batches, recording the time blocked in each next(): loading not hidden."""
        it = iter(loader)
        try:
            while True:
                start = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._waits.append((start, time.perf_counter() - start))
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # ends the loader's iteration now, not at garbage collection

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.clock.mark()
        yield
        end = self.clock.mark()
        self._marks.append((name, start, end))
        if name == "fwd_bwd":
            self._comm.append((start, self.hook.take(), end))

    def end(self, *, step: int, epoch: int, samples: int, read_s: float, decode_s: float) -> StepRecord:
        """Close the step: resolve marks (one synchronize on CUDA) into a StepRecord."""
        if self.clock.cuda:
            torch.cuda.current_stream().synchronize()
        step_s = time.perf_counter() - self._step_start
        sums = {"h2d": 0.0, "fwd_bwd": 0.0, "opt": 0.0}
        for name, start, end in self._marks:
            sums[name] = sums.get(name, 0.0) + self.clock.seconds(start, end)
        exposed, overlapped, splits = 0.0, 0.0, []
        for bwd_start, buckets, bwd_end in self._comm:
            e, o = self._comm_split(bwd_start, buckets, bwd_end)
            exposed, overlapped = exposed + e, overlapped + o
            splits.append((e, o))
        self.buckets_per_step = sum(len(b) for _, b, _ in self._comm) or self.buckets_per_step
        wait = sum(d for _, d in self._waits)
        rec = StepRecord(step=step, epoch=epoch, start_s=self.wall(self._step_start), step_s=step_s,
                         wait_s=wait, h2d_s=sums["h2d"], compute_s=max(0.0, sums["fwd_bwd"] - exposed),
                         comm_exposed_s=exposed, comm_overlapped_s=overlapped, opt_s=sums["opt"],
                         samples=samples, read_s=read_s, decode_s=decode_s)
        if self.keep_slices > 0:
            self.keep_slices -= 1
            rec.slices = _lay_out(rec) if self.clock.cuda else self._cpu_slices(splits)
        return rec

    def _cpu_slices(self, splits: list[tuple[float, float]]) -> list[tuple[str, float, float]]:
        """The step's real timeline on the host clock (wall seconds): every wait, copy, backward, comm."""
        out = [("wait", self.wall(s), d) for s, d in self._waits]
        backward = iter(splits)
        for name, start, end in self._marks:
            if name != "fwd_bwd":
                out.append((name, self.wall(start), end - start))
                continue
            exposed, overlapped = next(backward)
            out.append(("compute", self.wall(start), end - start - exposed))
            if exposed > 0:
                out.append(("comm_exposed", self.wall(end - exposed), exposed))
            if overlapped > 0:  # drawn on its own row, ending where the exposed part begins
                out.append(("comm_overlapped", self.wall(end - exposed - overlapped), overlapped))
        return sorted(out, key=lambda x: x[1])

    def _comm_split(self, bwd_start: Any, buckets: list[tuple[Any, list[Any]]], bwd_end: Any) -> tuple[float, float]:
        """(exposed, overlapped) seconds of one backward's all-reduces, on one time axis from bwd_start."""
        if not buckets:
            return 0.0, 0.0
        sec = self.clock.seconds
        end = sec(bwd_start, bwd_end)
        spans = [(sec(bwd_start, c), sec(bwd_start, d[0]) if d else end) for c, d in buckets]
        last_ready = max(s for s, _ in spans)
        last_done = min(max(e for _, e in spans), end)
        exposed = max(0.0, last_done - last_ready)
        busy = _union_length([(s, min(e, end)) for s, e in spans])
        return exposed, max(0.0, busy - exposed)


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _lay_out(rec: StepRecord) -> list[tuple[str, float, float]]:
    """Slices for the trace laid end to end from the step start (CUDA: device times have no host position)."""
    out, t = [], rec.start_s
    for name in PHASES:
        dur = getattr(rec, f"{name}_s")
        if dur > 0:
            out.append((name, t, dur))
        if name == "compute" and rec.comm_overlapped_s > 0:
            lap = min(rec.comm_overlapped_s, dur)
            out.append(("comm_overlapped", t + dur - lap, lap))
        t += dur
    return out
