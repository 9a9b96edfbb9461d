"""Loss spikes, named: a running median of each rank's loss, and the steps that jump above it.

A step whose loss on a rank exceeds --spike-factor x the median of that rank's last WINDOW_STEPS
finite losses (after MIN_STEPS steps), or is NaN or inf, is a spike on that rank. The recorder gathers the ranks' spikes at
each log interval; rank 0 names the samples behind each spiking step from the plan (the loader
state's history: nothing is logged per step) and writes spikes.jsonl. With --spike-sample-losses
each rank also keeps its step's per-sample losses, so a spike names its worst samples too.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

WINDOW_STEPS = 200  # the running median's window
MIN_STEPS = 20  # no spike before the median has this many steps
WORST_SAMPLES = 5  # per spiking rank, with --spike-sample-losses


class SpikeWatch:
    """One rank's running median of its loss; `observe` returns a spike record or None."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.losses: deque[float] = deque(maxlen=WINDOW_STEPS)

    def observe(self, step: int, loss: float, *, rank: int, keys: Sequence[str] = (),
                sample_losses: Sequence[float] | None = None) -> dict[str, Any] | None:
        """Record the step's loss; a spike when it passes factor x the median of the steps before, or is
        NaN or inf (whatever the median: a spike at once). Only finite losses enter the median."""
        median = statistics.median(self.losses) if len(self.losses) >= MIN_STEPS else None
        finite = math.isfinite(loss)
        if finite:
            self.losses.append(loss)
        if not self.factor or (finite and (median is None or not loss > self.factor * median)):
            return None
        spike: dict[str, Any] = {"step": step, "rank": rank, "loss": loss, "median": median}
        if sample_losses is not None:
            worst = sorted(zip(sample_losses, keys), reverse=True)[:WORST_SAMPLES]
            spike["worst"] = [{"key": k, "loss": v} for v, k in worst]
        return spike


def merge(gathered: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every rank's spikes merged by step: {step, ranks, loss per rank, median per rank, worst}."""
    by_step: dict[int, dict[str, Any]] = {}
    for spikes in gathered:
        for s in spikes:
            row = by_step.setdefault(s["step"], {"step": s["step"], "ranks": [], "loss": {}, "median": {}})
            row["ranks"].append(s["rank"])
            row["loss"][str(s["rank"])] = s["loss"]
            row["median"][str(s["rank"])] = s["median"]
            if "worst" in s:
                row.setdefault("worst", {})[str(s["rank"])] = s["worst"]
    for row in by_step.values():
        row["ranks"].sort()
    return [by_step[k] for k in sorted(by_step)]
