"""`which` after a skip: the run's history records the skip filters, so every step before and after
it (at another world size, into the next epoch) is named as the loader delivered it."""

from __future__ import annotations

import pytest

from dataio.loader.which import samples_of_step
from dataio.plan.schedule import Piece, Schedule
from tests.dataio.test_which import _check_samples, _doc, _loaders, _train, datasets  # noqa: F401 - the fixture


@pytest.mark.parametrize("mixed,world_size,grad_accum", [(False, 3, 2), (True, 3, 2), (False, 2, 1), ("schedule", 3, 1)])
def test_which_names_every_step_around_a_skip(datasets, mixed, world_size, grad_accum):  # noqa: F811 - the fixture
    urls = [datasets["samples"][0]] if not mixed else list(datasets["samples"])
    url, weights = (urls[0], None) if not mixed else (urls, [0.7, 0.3])
    if mixed == "schedule":  # 40 samples at 0.7/0.3, then 0.2/0.8: the skip lands in the first piece
        weights = Schedule((Piece((0.7, 0.3), 40), Piece((0.2, 0.8))))
    recorded: dict[int, dict[int, list[dict]]] = {}
    first = _loaders(url, 2, weights=weights)
    _train(first, 3, 1, recorded, epoch=0)
    state = first[0].state_dict()
    # resumed at another topology, or at the same one (the skip still starts a level of its own)
    second = _loaders(url, world_size, state=state, grad_accum=grad_accum, weights=weights)
    skip = list(range(0, 102, 3))  # global ids (the first source's keys are its ids)
    for loader in second:
        loader.skip(skip)
    _train(second, 1, grad_accum, recorded, epoch=0)
    _train(second, 1, grad_accum, recorded, epoch=0)  # a second iteration of the same epoch continues its level
    _train(second, 2, grad_accum, recorded, epoch=1)
    doc = _doc(urls, second, recorded, grad_accum)
    for step, per_rank in recorded.items():
        _check_samples(samples_of_step(doc, step), per_rank, step)
    if not mixed:  # keys are ids: nothing skipped comes after the skip
        after = {int(k) for step in range(4, len(recorded) + 1) for batches in recorded[step].values()
                 for batch in batches for k in batch["__key__"]}
        assert not after & set(skip)
