"""make_loader(weights=Schedule(...)): exact per-piece counts in the batches, and a resume mid-piece at
another world size and worker count that delivers what the uninterrupted run delivers."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from dataio.errors import StateError
from dataio.loader.make import make_loader
from dataio.plan.schedule import Piece, Schedule
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset

B = 2
SCHEDULE = Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75))))  # 120 a epoch: segments 48 + 72


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    write_tar_dataset(Store(str(a)), [30, 30])
    write_tar_dataset(Store(str(b)), [24, 36], seed=4)
    return [str(a), str(b)]


def _loaders(urls, world_size, num_workers, schedule=SCHEDULE, state=None):
    loaders = [make_loader(urls, weights=schedule, batch_size=B, num_workers=num_workers, rank=r,
                           world_size=world_size, decode=None, seed=1, shuffle_window=8) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(0)
    return loaders


def _run(loaders, steps=None) -> list[list[tuple[int, str]]]:
    """Per step, every rank's (source, key), rank by rank; all steps when `steps` is None."""
    its = [iter(loader) for loader in loaders]
    out = []
    for batches in zip(*its):
        out.append([(int(s), k) for b in batches for s, k in zip(b["source"].tolist(), b["__key__"])])
        if steps is not None and len(out) == steps:
            break
    for it in its:
        it.close()
    return out


def test_each_piece_gets_its_exact_counts_and_a_mid_piece_resume_delivers_the_rest(urls):
    whole = _run(_loaders(urls, 2, 2))
    flat = [x for step in whole for x in step]
    assert len(flat) == 120
    assert Counter(s for s, _ in flat[:48]) == {0: 36, 1: 12}  # piece 0: 0.75 / 0.25 of 48
    assert Counter(s for s, _ in flat[48:]) == {0: 18, 1: 54}  # piece 1 (to the epoch's end): 0.25 / 0.75 of 72
    first = _loaders(urls, 2, 2)
    head = _run(first, steps=3)  # 12 samples into piece 0
    state = first[0].state_dict()
    rest = _run(_loaders(urls, 3, 1, state=state))
    assert Counter(x for step in head + rest for x in step) == Counter(flat)


def test_a_changed_piece_that_ran_is_refused_a_later_one_is_noted(urls):
    first = _loaders(urls, 2, 0)
    _run(first, steps=3)
    state = first[0].state_dict()
    past = Schedule((Piece((0.5, 0.5), 48), Piece((0.25, 0.75))))
    with pytest.raises(StateError, match="weight"):
        _loaders(urls, 2, 0, schedule=past, state=state)
    future = Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75), 200), Piece((0.5, 0.5))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loaders(urls, 2, 0, schedule=future, state=state)
    assert any("schedule piece 1" in str(w.message) for w in caught)
