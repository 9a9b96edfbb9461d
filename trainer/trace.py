"""Timeline outputs: a Chrome/Perfetto trace (one track per rank) and a PNG of the per-step breakdown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainer.report import STAGE_LABELS
from trainer.timing import PHASES

COLORS = {"wait": "#d62728", "h2d": "#9467bd", "compute": "#2ca02c", "comm_exposed": "#ff7f0e",
          "opt": "#1f77b4"}


def chrome_trace(per_rank: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """Trace Event Format JSON: pid = rank, tid 0 = the step's stages, tid 1 = comm overlapped.

    per_rank[r] is rank r's list of step dicts with "slices" [(phase, start_s, dur_s)] on the
    wall clock; times are shifted so the trace starts at 0.
    """
    starts = [s[1] for steps in per_rank for st in steps for s in st["slices"]]
    t0 = min(starts) if starts else 0.0
    events: list[dict[str, Any]] = []
    for rank, steps in enumerate(per_rank):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "step stages"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 1,
                       "args": {"name": "comm overlapped with backward (inside compute)"}})
        for st in steps:
            for phase, start_s, dur_s in st["slices"]:
                lap = phase == "comm_overlapped"
                events.append({"ph": "X", "name": "all-reduce (overlapped)" if lap else STAGE_LABELS[phase],
                               "cat": phase, "pid": rank, "tid": 1 if lap else 0,
                               "ts": round((start_s - t0) * 1e6, 3), "dur": round(dur_s * 1e6, 3),
                               "args": {"step": st["step"], "epoch": st["epoch"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str, per_rank: Sequence[Sequence[dict[str, Any]]]) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(per_rank), f)


def write_chart(path: str, per_rank: Sequence[Sequence[dict[str, Any]]]) -> None:
    """Stacked per-step stage times, one panel per rank (matplotlib, Agg backend)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, ~0.4 CPU-s less to import

    num = max(1, len(per_rank))
    fig = Figure(figsize=(10, 2.2 * num + 0.8))
    axes = fig.subplots(num, 1, sharex=True, squeeze=False)
    for rank, steps in enumerate(per_rank):
        ax = axes[rank][0]
        x = [st["step"] for st in steps]
        ys = [[1000 * st[f"{p}_s"] for st in steps] for p in PHASES]
        if x:
            ax.stackplot(x, ys, labels=[STAGE_LABELS[p] for p in PHASES], colors=[COLORS[p] for p in PHASES],
                         step="mid")
        ax.set_ylabel(f"rank {rank}\nms/step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="upper right", fontsize=7, ncol=len(PHASES))
    axes[-1][0].set_xlabel("optimizer step")
    fig.suptitle("per-step time breakdown per rank (stacked; comm = exposed part only)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
