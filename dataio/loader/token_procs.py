"""worker_mode="processes" for token datasets: the plan's workers in DataLoader worker processes.

Worker w of this rank runs `worker_batches(job, slot(w), start)`: the same stream a reader thread or
the interleaved default runs, so order, state and resume are identical. DataLoader asks its workers in
turn and returns their batches in that order (batch j from worker j % num_workers, as the plan assigns
it; a worker is exhausted only after its last turn). A token batch is a few tensors, which torch moves
through shared memory. Each worker opens its own storage clients: a Store pickles as its URL and options
(s3fs is not fork-safe), TokenShards as its store and manifest, so the spawn start method works too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from dataio.loader.token_batches import TokenJob, worker_batches
from dataio.plan.types import PlanState, Topology


class _TokenStreams(torch.utils.data.IterableDataset):
    """In DataLoader worker w: plan worker w's batches from `start` to the epoch's end."""

    def __init__(self, job: TokenJob, topology: Topology, start: PlanState) -> None:
        self.job, self.topology, self.start = job, topology, start

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        assert info is not None and info.num_workers == self.topology.num_workers, "one process per plan worker"
        return worker_batches(self.job, self.topology.slot(info.id), self.start)


class TokenProcesses:
    """num_workers worker processes for one iteration (the plan's start differs each time)."""

    def __init__(self, job: TokenJob, topology: Topology, start: PlanState, *, prefetch_factor: int,
                 context: str | None) -> None:
        loader = torch.utils.data.DataLoader(_TokenStreams(job, topology, start), batch_size=None,
                                             num_workers=topology.num_workers, prefetch_factor=prefetch_factor,
                                             multiprocessing_context=context, collate_fn=_identity)
        self._it: Any = iter(loader)

    def batches(self, steps: int) -> Iterator[dict[str, Any]]:
        """Batch j from worker j % num_workers, for j < steps."""
        for j in range(steps):
            try:
                yield next(self._it)
            except StopIteration:
                raise RuntimeError(f"the token worker processes ended before batch {j} of {steps}") from None

    def close(self) -> None:
        """Stop the worker processes now (not when the iterator is garbage collected)."""
        shutdown = getattr(self._it, "_shutdown_workers", None)  # DataLoader's own, as its __del__ calls it
        if shutdown is not None:
            shutdown()


def _identity(batch: dict[str, Any]) -> dict[str, Any]:
    return batch
