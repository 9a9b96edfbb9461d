"""The tickets the main process sends to the plan workers: one per batch of the iteration, lazily."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from dataio.plan.types import PlanState
from dataio.stream.job import Ticket


class TicketSampler(torch.utils.data.Sampler):
    """Yields the current iteration's tickets in order; lives in the main process only."""

    def __init__(self) -> None:
        self._token, self._plan, self._steps = 0, PlanState(epoch=0), 0
        self._head, self._warm = 0, False
        self.released_below = 0  # batches of this iteration the caller has moved past
        self.raw_of: Callable[[int], bool] | None = None  # decode="auto": which tickets ship raw (hybrid.py)

    def start(self, token: int, plan: PlanState, steps: int, head: int = 0) -> None:
        """Tickets for an iteration: batches below `head` are made in the main process."""
        self._token, self._plan, self._steps, self._head, self._warm = token, plan, steps, head, False
        self.released_below = 0

    def warm(self, plan: PlanState, head: int, num_workers: int) -> None:
        """One warm ticket per worker (token 0, before any iteration): open the stream, read ahead."""
        self._token, self._plan, self._steps, self._head, self._warm = 0, plan, num_workers, head, True

    def __iter__(self) -> Iterator[Ticket]:
        token, plan, head, warm = self._token, self._plan, self._head, self._warm
        # Lazy: each ticket is made when the DataLoader sends it, with the mark as it is then.
        raw_of = self.raw_of if not warm else None
        return (Ticket(token, plan, k, self.released_below, head=head, warm=warm, raw=bool(raw_of and raw_of(k)))
                for k in range(self._steps))

    def __len__(self) -> int:
        return self._steps
