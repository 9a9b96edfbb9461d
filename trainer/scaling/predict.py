"""A prediction past the machine: samples/s and efficiency at N ranks from measurements at 1 and 2.

The model (pure arithmetic, no I/O):
    all-reduce of B bytes on N ranks (ring):  t(N) = 2(N-1) * alpha * buckets + 2(N-1)/N * B / bw
        alpha is one hop's latency, bw the link bandwidth, both fitted from a sweep of message
        sizes at N=2, where t = 2 * alpha + B / bw is a straight line in B (or given for a cluster).
    step at N:      local_s + wait_s (both from the smallest measured N: a rank's own work, and the data
                    wait it did not hide) + (1 - overlap) * t(N), overlap being the measured share of
                    all-reduce time hidden behind backward. Comm measured beyond the link model at
                    the largest measured N (a hook's own work, waiting for peers) is kept, constant;
                    so is, for N > 1, what the measured step there has beyond all of the above
                    (ranks sharing cores or memory bandwidth, waiting for the slowest rank): the
                    model goes through the measured rates at N=1 and at that N, exactly.
    per-rank rate:  min(batch / step, input ceiling per rank, storage bandwidth / N / bytes per sample)
The first two terms make the comm wall (efficiency falls below a threshold), the last two the data
wall (the input pipeline or the shared storage cannot feed a rank as fast as it computes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One hop of a ring all-reduce: latency (s) and bandwidth (bytes/s)."""

    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        if self.latency_s < 0 or not self.bytes_per_s > 0:
            raise ValueError(f"a link needs latency >= 0 and bandwidth > 0, got {self.latency_s}, {self.bytes_per_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """What the runs measured; rates in samples/s, times in seconds per optimizer step."""

    samples_per_step: float  # per rank: batch_size x grad_accum
    local_s: float  # step at N=1 minus its data wait and comm: compute, copy, optimizer, bookkeeping
    wait_s: float = 0.0  # data wait per step measured at N=1 (loading not hidden), kept as measured
    wire_bytes: float  # bytes each rank all-reduces per step
    num_buckets: int = 1  # all-reduce calls per step (each pays the latency)
    comm_extra_s: float = 0.0  # measured comm per step beyond the link model (hook work, peers' jitter), N > 1
    step_extra_s: float = 0.0  # N > 1: the measured step beyond every term above (signed); see report.py
    overlap_share: float = 0.0  # of all-reduce time that ran during backward (hidden)
    input_per_rank: float | None = None  # the input pipeline's ceiling on one rank; None: unknown
    bytes_per_sample: float = 0.0  # stored bytes read per sample (for the storage wall)
    storage_bytes_per_s: float | None = None  # aggregate storage bandwidth; None: unbounded

    def __post_init__(self) -> None:
        if not self.samples_per_step > 0 or not self.local_s > 0 or self.wait_s < 0:
            raise ValueError("samples_per_step and local_s must be > 0, wait_s >= 0")
        if not 0.0 <= self.overlap_share <= 1.0 or self.num_buckets < 1 or min(self.wire_bytes, self.comm_extra_s) < 0:
            raise ValueError("overlap_share in [0, 1], num_buckets >= 1, wire_bytes >= 0, please")
        if not self.local_s + self.wait_s + self.step_extra_s > 0:
            raise ValueError("step_extra_s must leave a step > 0 (local_s + wait_s + step_extra_s > 0)")


def fit_link(sizes_bytes: Sequence[float], seconds: Sequence[float], *, world_size: int = 2) -> Link:
    """Least-squares line t = a + b * bytes through all-reduce timings at `world_size` ranks, read as a
    ring: a = 2(N-1) * latency, b = 2(N-1)/N / bandwidth. Repeats of a size are reduced to their
    fastest (interference on a shared machine only adds time). Where the small sizes' jitter tilts
    the relative-error fit flat or negative, the slope is read between the smallest and largest
    size instead; a sweep whose largest message is not the slowest cannot be fitted."""
    if world_size < 2:
        raise ValueError("an all-reduce sweep needs world_size >= 2")
    by_size: dict[float, list[float]] = {}
    for size, t in zip(sizes_bytes, seconds, strict=True):
        by_size.setdefault(float(size), []).append(float(t))
    if len(by_size) < 2:
        raise ValueError("fitting latency and bandwidth needs at least two message sizes")
    xs = sorted(by_size)
    ys = [min(by_size[x]) for x in xs]
    # Weighted by 1/t^2 (relative error): sizes span decades, and the small ones carry the latency.
    ws = [1.0 / max(y, 1e-12) ** 2 for y in ys]
    total = sum(ws)
    mean_x = sum(w * x for w, x in zip(ws, xs, strict=True)) / total
    mean_y = sum(w * y for w, y in zip(ws, ys, strict=True)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(ws, xs, strict=True))
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in zip(ws, xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    if not slope > 0 and ys[-1] > ys[0]:  # jitter at the small sizes: the two ends decide
        slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
        intercept = ys[0] - slope * xs[0]
    if not slope > 0:
        raise ValueError(f"all-reduce time does not grow with message size (slope {slope:.3g} s/byte): "
                         "sweep bigger messages, or give --link-gbps / --link-latency-us")
    hops = 2 * (world_size - 1)
    return Link(latency_s=max(0.0, intercept) / hops, bytes_per_s=(hops / world_size) / slope)


def allreduce_s(link: Link, num_bytes: float, world_size: int, *, num_messages: int = 1) -> float:
    """Seconds of a ring all-reduce of `num_bytes` (in `num_messages` calls) over `world_size` ranks."""
    if world_size <= 1:
        return 0.0
    hops = 2 * (world_size - 1)
    return hops * link.latency_s * num_messages + hops / world_size * num_bytes / link.bytes_per_s


def comm_s(m: Measured, link: Link, world_size: int) -> float:
    """All-reduce seconds per step at `world_size`: the link model plus the comm it did not explain."""
    if world_size <= 1:
        return 0.0
    return allreduce_s(link, m.wire_bytes, world_size, num_messages=m.num_buckets) + m.comm_extra_s


def step_s(m: Measured, link: Link, world_size: int) -> float:
    """A rank's step at `world_size` where compute and comm decide (no data wall)."""
    extra = m.step_extra_s if world_size > 1 else 0.0
    return m.local_s + m.wait_s + (1.0 - m.overlap_share) * comm_s(m, link, world_size) + extra


def at(m: Measured, link: Link, world_size: int) -> dict[str, Any]:
    """Predicted step, rates and the limiting term at `world_size` ranks."""
    comm = comm_s(m, link, world_size)
    exposed = (1.0 - m.overlap_share) * comm
    step = step_s(m, link, world_size)
    limits = {"compute+comm": m.samples_per_step / step}
    if m.input_per_rank is not None:
        limits["input pipeline"] = m.input_per_rank
    if m.storage_bytes_per_s is not None and m.bytes_per_sample > 0:
        limits["storage"] = m.storage_bytes_per_s / world_size / m.bytes_per_sample
    limit = min(limits, key=limits.__getitem__)
    per_rank = limits[limit]
    return {"world_size": world_size, "samples_per_s": per_rank * world_size, "per_rank_samples_per_s": per_rank,
            "allreduce_s": comm, "exposed_comm_s": exposed, "step_s": m.samples_per_step / per_rank,
            "limit": limit, "compute_samples_per_s": limits["compute+comm"] * world_size,
            # paid but idle: exposed all-reduce plus waiting for data where the data wall binds
            "wasted_share": max(0.0, 1.0 - m.local_s / (m.samples_per_step / per_rank))}


def predict(m: Measured, link: Link, world_sizes: Iterable[int]) -> list[dict[str, Any]]:
    """`at` for each world size, with efficiency = rate(N) / (N x rate(1)) against the predicted 1 rank."""
    one = at(m, link, 1)["samples_per_s"]
    rows = []
    for n in world_sizes:
        row = at(m, link, n)
        row["efficiency"] = row["samples_per_s"] / (n * one)
        rows.append(row)
    return rows


def walls(m: Measured, link: Link, *, max_world_size: int, min_efficiency: float = 0.8) -> dict[str, Any]:
    """The first N (1..max_world_size) at which each wall is hit, and which comes first.

    data wall: the input pipeline or the storage share per rank is below what a rank could compute
    (it waits for data from then on); comm wall: efficiency (as in `predict`) falls below
    `min_efficiency` while compute+comm is what limits the rate.
    """
    comm_at, data_at, data_kind = None, None, None
    one = at(m, link, 1)["samples_per_s"]
    for n in range(1, max_world_size + 1):
        row = at(m, link, n)
        if comm_at is None and row["limit"] == "compute+comm" and row["samples_per_s"] / (n * one) < min_efficiency:
            comm_at = n
        if data_at is None and row["limit"] in ("input pipeline", "storage"):
            data_at, data_kind = n, row["limit"]
        if comm_at is not None and data_at is not None:
            break
    hits = [(n, name) for n, name in ((comm_at, "comm"), (data_at, "data")) if n is not None]
    first = min(hits)[1] if hits else None
    return {"comm_wall_at": comm_at, "data_wall_at": data_at, "data_wall_kind": data_kind, "first": first,
            "min_efficiency": min_efficiency, "max_world_size": max_world_size,
            "text": _say(comm_at, data_at, data_kind, first, min_efficiency, max_world_size)}


def _say(comm_at: int | None, data_at: int | None, data_kind: str | None, first: str | None,
         min_eff: float, max_n: int) -> str:
    if first is None:
        return f"no wall up to {max_n} ranks: efficiency stays >= {min_eff:.0%} and the data keeps up"
    parts = []
    if data_at is not None:
        parts.append(f"data wall ({data_kind}) at {data_at} rank{'' if data_at == 1 else 's'}")
    if comm_at is not None:
        parts.append(f"comm wall (efficiency < {min_eff:.0%}) at {comm_at} rank{'' if comm_at == 1 else 's'}")
    return f"{first} wall first: " + "; ".join(sorted(parts, key=lambda p: not p.startswith(first)))
