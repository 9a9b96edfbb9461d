"""A source added on resume to a mixture with a weight schedule: it joins where a later piece weighs it
(a segment boundary or the next epoch), with a warning saying so; the past stays as it ran."""

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
BEFORE = Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75))))  # 120 an epoch: segments 48 + 72
# The same past, and source 2 from run position 120 (epoch 1) on.
AFTER = Schedule((Piece((0.75, 0.25, 0.0), 48), Piece((0.25, 0.75, 0.0), 72), Piece((0.2, 0.4, 0.4))))


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    roots = [tmp_path_factory.mktemp(n) for n in "abc"]
    for i, (root, sizes) in enumerate(zip(roots, ([30, 30], [24, 36], [20, 20]))):
        write_tar_dataset(Store(str(root)), sizes, seed=i)
    return [str(r) for r in roots]


def _loaders(urls, world_size, schedule, state=None, **options):
    loaders = [make_loader(urls, weights=schedule, batch_size=B, num_workers=0, rank=r, world_size=world_size,
                           decode=None, seed=1, shuffle_window=8, **options) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    return loaders


def _epoch(loaders, epoch, steps=None) -> list[tuple[int, str]]:
    """Every rank's (source, key) of `steps` steps (None: to the epoch's end)."""
    its = []
    for loader in loaders:
        loader.set_epoch(epoch)
        its.append(iter(loader))
    out = []
    for n, batches in enumerate(zip(*its), 1):
        out += [(int(s), k) for b in batches for s, k in zip(b["source"].tolist(), b["__key__"])]
        if n == steps:
            break
    for it in its:
        it.close()
    return out


def test_an_added_source_joins_at_the_next_epoch_and_the_past_replays(urls):
    whole = _epoch(_loaders(urls[:2], 2, BEFORE), 0)  # the uninterrupted run without the new source
    first = _loaders(urls[:2], 2, BEFORE)
    head = _epoch(first, 0, steps=3)
    state = first[0].state_dict()
    with pytest.raises(StateError, match="pass epoch_samples=120"):  # the sum of the sizes would grow by 40
        _loaders(urls, 3, AFTER, state=state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _loaders(urls, 3, AFTER, state=state, epoch_samples=120)
    assert any("source 2 (" in str(w.message) and "joins at run position 120" in str(w.message) for w in caught)
    rest = _epoch(resumed, 0)
    assert not Counter(head + rest) - Counter(whole)  # the epoch in progress is the saved mixture's
    assert sum((Counter(whole) - Counter(head + rest)).values()) < 3 * B  # but the new topology's tail
    later = Counter(s for s, _ in _epoch(resumed, 1))
    assert later == {0: 24, 1: 48, 2: 48}  # piece 2: 0.2 / 0.4 / 0.4 of 120


def test_an_added_source_may_join_at_the_next_segment_but_not_change_the_past(urls):
    first = _loaders(urls[:2], 1, BEFORE)
    head = _epoch(first, 0, steps=3)  # 6 positions into segment 0 (piece 0: positions 0..48)
    state = first[0].state_dict()
    next_segment = Schedule((Piece((0.75, 0.25, 0.0), 48), Piece((0.25, 0.5, 0.25))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _loaders(urls, 1, next_segment, state=state, epoch_samples=120)
    assert any("joins at run position 48" in str(w.message) for w in caught)
    rest = _epoch(resumed, 0)
    assert Counter(s for s, _ in head + rest) == {0: 36 + 18, 1: 12 + 36, 2: 18}  # 72 at 0.25 / 0.5 / 0.25
    in_progress = Schedule((Piece((0.75, 0.25, 0.1), 48), Piece((0.25, 0.75, 0.0))))  # in the segment in progress
    with pytest.raises(StateError, match=r"piece 0 gave run positions 0\.\.48 the weights \[0\.75, 0\.25, 0\.0\]"):
        _loaders(urls, 1, in_progress, state=state, epoch_samples=120)
    with pytest.raises(StateError, match="in the same order"):
        _loaders([urls[2], *urls[:2]], 1, AFTER, state=state, epoch_samples=120)
