"""One resume harness for every stateful piece, with every rank run in one process.

Two views of the same property (DESIGN.md 4, modelled on torchdata's run_test_save_load_state):

- `check_resume` / `check_same_topology_resume` need three callables, so the sample plan (pure
  arithmetic on a PlanState) and a loader (objects with a state_dict) both run through them:
      deliver(state, topology) -> per rank, the batches from the state's position to the end
      advance(state, topology, batches) -> the state after `batches` more delivered batches
      real_keys(batch) -> the batch's non-padding sample keys
  A topology is a (world_size, num_workers) pair.
- `check_save_load_state` drives Stateful iterables (`__iter__`, `__len__`, `set_epoch`,
  `state_dict`, `load_state_dict`; one per rank): stop at a midpoint, save, load into fresh
  objects, check the rest of the epoch and the whole next epoch match an uninterrupted run.
`loader_deliver` / `loader_advance` adapt objects like ShardLoader to the first view.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

Topology = tuple[int, int]  # (world_size, num_workers)


class StatefulLoader(Protocol):
    """What check_save_load_state drives: ShardLoader, the trainer's MemoryLoader, ..."""

    def __iter__(self) -> Any: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# --- the arithmetic view: deliver / advance ---------------------------------------------------


def check_resume(deliver: Callable[[Any, Topology], list[list[Any]]],
                 advance: Callable[[Any, Topology, int], Any],
                 real_keys: Callable[[Any], Sequence[Any]],
                 state: Any,
                 schedule: Sequence[tuple[Topology, int | None]]) -> tuple[list[Any], Any]:
    """Deliver `batches` per rank at each topology in turn (None: to the end); resume from the state.

    Asserts equal steps on every rank at every stage and no key delivered twice; returns the real
    keys delivered, in order, and the final state.
    """
    delivered: list[Any] = []
    for topology, batches in schedule:
        per_rank = deliver(state, topology)
        steps = {len(rank_batches) for rank_batches in per_rank}
        assert len(steps) == 1, f"unequal steps per rank at {topology}: {sorted(steps)}"
        (available,) = steps
        take = available if batches is None else batches
        assert take <= available, f"asked for {take} batches at {topology}, only {available} left"
        for rank_batches in per_rank:
            for batch in rank_batches[:take]:
                delivered.extend(real_keys(batch))
        state = advance(state, topology, take)
    twice = [k for k, count in Counter(delivered).items() if count > 1]
    assert not twice, f"delivered twice: {twice[:10]}"
    return delivered, state


def check_same_topology_resume(deliver: Callable[[Any, Topology], list[list[Any]]],
                               advance: Callable[[Any, Topology, int], Any],
                               state: Any, topology: Topology, batches: int) -> None:
    """Resuming at the topology that saved the state replays exactly the uninterrupted run."""
    full = deliver(state, topology)
    resumed = deliver(advance(state, topology, batches), topology)
    assert len(full) == len(resumed)
    for rank, (a, b) in enumerate(zip(full, resumed)):
        assert a[batches:] == b, f"rank {rank}: resumed batches differ from the uninterrupted run"


# --- the object view: stop, save, load into fresh objects ---------------------------------------


def check_save_load_state(make: Callable[[], Sequence[StatefulLoader]], *, stop: int,
                          summary: Callable[[Any], Any], epochs: int = 2) -> int:
    """Stop every rank after `stop` batches of epoch 0 (clamped to its length), save, load the state
    into fresh objects: the rest of epoch 0 and every later epoch equal an uninterrupted run.

    `make()` builds one fresh object per rank; `summary(batch)` is what must match (comparable
    with ==). Also checks that every rank saves the same state, that it survives JSON, that len()
    counts what is left, and that a state saved at the end of an epoch leaves nothing of it and
    moves on to the next. Returns the stop used.
    """
    full, end_state = _uninterrupted(make, epochs, summary)
    stop = min(stop, len(full[0][0]))
    with _built(make) as ranks:
        heads = [[summary(b) for b in _take(loader, stop)] for loader in ranks]
        state = _same_saved_state(ranks, f"after {stop} batches")
    with _built(make, state) as ranks:
        for rank, loader in enumerate(ranks):
            loader.set_epoch(0)  # the loaded state's epoch: keeps its position
            assert len(loader) == len(full[rank][0]) - stop, f"rank {rank}: len() after loading"
            rest = [summary(b) for b in loader]
            assert heads[rank] + rest == full[rank][0], f"rank {rank}: epoch 0 resumed after {stop} batches differs"
            _check_later_epochs(loader, full[rank], summary, rank)
    with _built(make, end_state) as ranks:
        for rank, loader in enumerate(ranks):
            assert len(loader) == 0 and list(loader) == [], f"rank {rank}: an epoch saved at its end delivers more"
            _check_later_epochs(loader, full[rank], summary, rank)
    return stop


def _uninterrupted(make: Callable[[], Sequence[StatefulLoader]], epochs: int,
                   summary: Callable[[Any], Any]) -> tuple[list[list[list[Any]]], dict[str, Any]]:
    """Per rank, per epoch, the batch summaries of a run never stopped; and the state saved at the
    end of epoch 0 (checked equal across ranks)."""
    end_state: dict[str, Any] = {}
    with _built(make) as ranks:
        full: list[list[list[Any]]] = [[] for _ in ranks]
        for epoch in range(epochs):
            for rank, loader in enumerate(ranks):
                loader.set_epoch(epoch)
                full[rank].append([summary(b) for b in loader])
            if epoch == 0:
                end_state = _same_saved_state(ranks, "at the end of epoch 0")
    steps = {tuple(len(e) for e in per_rank) for per_rank in full}
    assert len(steps) == 1, f"unequal steps per rank: {steps}"
    return full, end_state


def _same_saved_state(ranks: Sequence[StatefulLoader], when: str) -> dict[str, Any]:
    """Every rank's state, through JSON as a checkpoint stores it; they must all be equal."""
    states = [json.loads(json.dumps(loader.state_dict())) for loader in ranks]
    assert all(s == states[0] for s in states), f"ranks saved different states {when}: {states}"
    return states[0]


@contextlib.contextmanager
def _built(make: Callable[[], Sequence[StatefulLoader]], state: dict[str, Any] | None = None
           ) -> Iterator[Sequence[StatefulLoader]]:
    """Fresh objects, one per rank, each loaded with `state` if one is given; closed on the way out."""
    ranks = make()
    try:
        if state is not None:
            for loader in ranks:
                loader.load_state_dict(state)
        yield ranks
    finally:
        _close(ranks)


def _check_later_epochs(loader: StatefulLoader, full: list[list[Any]], summary: Callable[[Any], Any],
                        rank: int) -> None:
    for epoch in range(1, len(full)):
        loader.set_epoch(epoch)
        assert [summary(b) for b in loader] == full[epoch], f"rank {rank}: epoch {epoch} after a resume differs"


def _take(loader: StatefulLoader, num_batches: int) -> list[Any]:
    """The first num_batches batches of an iteration, then break out of it."""
    out: list[Any] = []
    if num_batches == 0:
        return out
    for batch in loader:
        out.append(batch)
        if len(out) == num_batches:
            break
    return out


def _close(ranks: Sequence[Any]) -> None:
    for loader in ranks:
        close = getattr(loader, "close", None)
        if close is not None:
            close()


# --- loaders through the arithmetic view -------------------------------------------------------


def loader_deliver(make_at: Callable[[Topology], Sequence[StatefulLoader]],
                   summary: Callable[[Any], Any]) -> Callable[[Any, Topology], list[list[Any]]]:
    """`deliver` for loaders: fresh objects of every rank at the topology load the state (None:
    start afresh) and run to the end of the epoch."""

    def deliver(state: dict[str, Any] | None, topology: Topology) -> list[list[Any]]:
        with _built(lambda: make_at(topology), state) as ranks:
            return [[summary(b) for b in loader] for loader in ranks]

    return deliver


def loader_advance(make_at: Callable[[Topology], Sequence[StatefulLoader]]
                   ) -> Callable[[Any, Topology, int], dict[str, Any]]:
    """`advance` for loaders: every rank loads the state, delivers `batches`, saves (all equal)."""

    def advance(state: dict[str, Any] | None, topology: Topology, batches: int) -> dict[str, Any]:
        with _built(lambda: make_at(topology), state) as ranks:
            for loader in ranks:
                got = _take(loader, batches)
                assert len(got) == batches, f"only {len(got)} of {batches} batches at {topology}"
            return _same_saved_state(ranks, f"after {batches} batches at {topology}")

    return advance
