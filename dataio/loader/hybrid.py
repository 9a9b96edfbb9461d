"""decode="auto" on a CUDA device: CPU workers and the GPU decoder both make batches, split by measured rates.

The plan still decides every batch's samples and order; only which decoder makes a batch's pixels is
chosen here, batch by batch, when its ticket is made: `raw_of(k)` True sends ticket k with raw=True,
so its worker ships the batch undecoded (as decode=None) and the GPU feed decodes it; otherwise the
worker decodes it on the CPU as decode="cpu" does. The GPU share follows the two sides' measured
rates (samples per second of the GPU decoder's wall time; the workers' own decode + read seconds,
times the number of workers), smoothed, so each side gets work in proportion to what it can do.
"""

from __future__ import annotations

import threading
from typing import Any

SMOOTHING = 0.2  # weight of each new rate measurement (exponential moving average)
MIN_SHARE, MAX_SHARE = 0.05, 0.95  # each side keeps some batches, so its rate stays measured


class Split:
    """The GPU's share of batches, from measured rates; `raw_of(k)` decides ticket k (in ticket order)."""

    def __init__(self, *, num_workers: int, gpu_share: float = 0.5) -> None:
        self.num_workers = max(1, num_workers)
        self.gpu_share = gpu_share
        self.rates: dict[str, float | None] = {"gpu": None, "cpu": None}  # samples/s, smoothed
        self.counts = {"gpu": [0, 0], "cpu": [0, 0]}  # side -> [batches, samples]
        self._credit = 0.0  # GPU batches owed: a Sturmian split of the ticket sequence at gpu_share
        self._lock = threading.Lock()

    def raw_of(self, batch_index: int) -> bool:
        """Whether ticket `batch_index` ships its batch raw for the GPU (called once per ticket, in order)."""
        with self._lock:
            self._credit += self.gpu_share
            if self._credit >= 1.0:
                self._credit -= 1.0
                return True
            return False

    def note(self, side: str, *, samples: int, seconds: float) -> None:
        """One batch made by `side` ("gpu" or "cpu") in `seconds` of that side's time."""
        with self._lock:
            self.counts[side][0] += 1
            self.counts[side][1] += samples
            if seconds <= 0:
                return
            rate = samples / seconds * (self.num_workers if side == "cpu" else 1)
            old = self.rates[side]
            self.rates[side] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate
            gpu, cpu = self.rates["gpu"], self.rates["cpu"]
            if gpu is not None and cpu is not None:
                self.gpu_share = min(MAX_SHARE, max(MIN_SHARE, gpu / (gpu + cpu)))

    def report(self) -> dict[str, Any]:
        """The split and each side's rate, for the loader's stats."""
        with self._lock:
            return {"gpu_share": round(self.gpu_share, 3),
                    **{f"{side}_{what}": value for side in ("gpu", "cpu")
                       for what, value in (("batches", self.counts[side][0]), ("samples", self.counts[side][1]),
                                           ("samples_per_s", self.rates[side]))}}
