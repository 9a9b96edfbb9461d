"""Loader epochs from S3 through 503s, resets, truncated bodies and stalls: every sample exactly
once, and the throughput against no fault (reported, never judged)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from dataio.storage.store import StorageOptions, Store
from tools.delay_proxy import DelayProxy
from tools.faults.common import Row, Size, epoch_ids, write_raw_dataset


LOADER_FAULTS: list[tuple[str, dict[str, Any], bool]] = [
    ("no fault", {}, True),
    ("10% 503 SlowDown", {"error_rate": 0.1}, True),
    ("10% connection resets", {"reset_rate": 0.1}, True),
    ("10% truncated bodies", {"truncate_rate": 0.1}, True),
    ("5% 2-second stalls, hedged", {"stall_rate": 0.05, "stall_s": 2.0}, True),
    ("5% 2-second stalls, no hedging", {"stall_rate": 0.05, "stall_s": 2.0}, False),
]


def loader_scenarios(server: Any, size: Size, seed: int, only: tuple[str, ...] = ()) -> list[Row]:
    """Epochs through each fault, the faults interleaved round by round in a turning order (so a
    busy spell of the machine hits every one alike): exactly once, and the median samples/s
    against no fault. `only`: the faults whose name holds one of these words (no fault always runs)."""
    faults_run = [f for f in LOADER_FAULTS if f[0] == "no fault" or not only or any(w in f[0] for w in only)]
    bucket = server.new_bucket()
    url = f"s3://{bucket}/raw"
    total = write_raw_dataset(Store(url, server.options()), size, seed=seed)
    rates: dict[str, list[float]] = {name: [] for name, _, _ in faults_run}
    ok = dict.fromkeys(rates, True)
    hedges = {name: [0, 0] for name in rates}
    seen: dict[str, list[int]] = {name: [0] * 6 for name in rates}
    for epoch in range(size.epochs):
        # The order turns each round: no scenario always runs first (after the machine was idle)
        # or right after the same neighbour.
        turn = epoch % len(faults_run)
        for name, faults, hedge in faults_run[turn:] + faults_run[:turn]:
            with DelayProxy(server.endpoint_url, delay_s=0.0, seed=seed + epoch, **faults) as proxy:
                options = replace(server.options(), endpoint_url=proxy.url,
                                  hedge=StorageOptions().hedge if hedge else None)
                ids, seconds, stats = epoch_ids(url, options, epoch=epoch)
            ok[name] = ok[name] and sorted(ids) == list(range(total))
            rates[name].append(total / seconds)
            hedges[name][0] += stats.hedged_reads
            hedges[name][1] += stats.ranged_reads
            p = proxy.stats
            for i, n in enumerate((p.num_requests, p.num_errors, p.num_resets, p.num_truncated, p.num_hangs,
                                   p.num_stalls)):
                seen[name][i] += n
    base = statistics.median(rates["no fault"])
    rows = []
    for name, _, hedge in faults_run:
        rate = statistics.median(rates[name])
        # Paired by round too: each round's ratio to that round's no-fault epoch (drift cancels).
        ratios = [r / b for r, b in zip(rates[name], rates["no fault"])]
        paired = statistics.median(ratios)
        figure = (f"{rate:,.0f} samples/s, {rate / base:.0%} of no fault (median of {len(rates[name])} epochs; "
                  f"median per-round ratio {paired:.0%}" + ("" if name == "no fault" else
                  f", rounds {min(ratios):.0%}-{max(ratios):.0%}") + ")")
        if hedge:
            figure += f"; {hedges[name][0]} of {hedges[name][1]} reads hedged"
        n = seen[name]
        rows.append(Row(group="loader", scenario=f"epoch through {name}", figure=figure, passed=ok[name],
                        note=f"proxy: {n[0]} requests, {n[1]} 503s, {n[2]} resets, {n[3]} truncated, {n[4]} hung, "
                             f"{n[5]} stalled" + ("" if ok[name] else "; samples missing or repeated")))
    return rows
