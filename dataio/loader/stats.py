"""What a loader counted in the main process, for the caller: corrupt samples skipped, hedged reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoaderStats:
    """What the loader counted in the main process: corrupt samples replaced under on_corrupt='skip',
    hedged reads reported by the workers."""

    corrupt_skipped: int = 0
    corrupt_keys: list[str] = field(default_factory=list)  # "shard URL#sample key", first 1000
    # Ranged reads in the workers, how many got a hedge (a second request after a slow start),
    # how many of those the hedge won, and slow reads left alone because the budget was spent.
    ranged_reads: int = 0
    hedged_reads: int = 0
    hedges_won: int = 0
    hedges_over_budget: int = 0
    # decode="gpu" / "auto" (loader/gpu_feed.py): the device decoder, samples per side, the split and rates.
    gpu_decode: dict[str, Any] = field(default_factory=dict)

    def add_hedges(self, counts: dict[str, int]) -> None:
        self.ranged_reads += counts.get("requests", 0)
        self.hedged_reads += counts.get("hedged", 0)
        self.hedges_won += counts.get("won", 0)
        self.hedges_over_budget += counts.get("over_budget", 0)

    def add_skipped(self, keys: Sequence[str]) -> None:
        self.corrupt_skipped += len(keys)
        self.corrupt_keys.extend(keys[: max(0, 1000 - len(self.corrupt_keys))])
