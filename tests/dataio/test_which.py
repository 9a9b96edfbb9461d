"""`which` against what the loader delivered: every step of a run that resumed 2 ranks -> 3 ranks
(another grad_accum too) and into a second epoch, one dataset and a mixture, loaders in one process."""

from __future__ import annotations

import json

import pytest

from dataio.errors import StateError
from dataio.loader.make import make_loader
from dataio.loader.which import samples_of_step, sidecar_doc
from dataio.plan.schedule import Piece, Schedule
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset

B = 4


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[str, str]:
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    write_tar_dataset(Store(str(a)), [23, 9, 30, 40])
    write_tar_dataset(Store(str(b)), [11, 17], seed=5)
    return str(a), str(b)


def _loaders(url, world_size, *, state=None, grad_accum=1, weights=None):
    loaders = [make_loader(url, batch_size=B, weights=weights, num_workers=0, rank=r, world_size=world_size,
                           decode=None, seed=3, shuffle_window=8) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        loader.history.grad_accum = grad_accum
    return loaders


def _train(loaders, steps, grad_accum, recorded, *, epoch):
    """Take `steps` optimizer steps from every rank in lockstep; recorded[step] = {rank: keys}."""
    its = []
    for loader in loaders:
        loader.set_epoch(epoch)
        its.append(iter(loader))
    for _ in range(steps):
        step = len(recorded) + 1
        recorded[step] = {r: [k for _ in range(grad_accum) for k in next(it)["__key__"]] for r, it in enumerate(its)}
    for it in its:
        it.close()


def _doc(url, weights, loaders, recorded, grad_accum):
    sources = [(url, None)] if isinstance(url, str) else [(u, None) for u in url]
    return json.loads(sidecar_doc(step=len(recorded), epoch=0, grad_accum=grad_accum, sources=sources,
                                  loader_state=loaders[0].state_dict()))


@pytest.mark.parametrize("mixed", ["one", "mixture", "schedule"])
def test_which_names_every_step_of_a_resumed_run(datasets, mixed):
    url, weights = (datasets[0], None) if mixed == "one" else (list(datasets), [0.7, 0.3])
    if mixed == "schedule":  # 40 samples at 0.7/0.3, then 0.2/0.8: the resume falls in the first piece
        weights = Schedule((Piece((0.7, 0.3), 40), Piece((0.2, 0.8))))
    recorded: dict[int, dict[int, list[str]]] = {}
    first = _loaders(url, 2, weights=weights)
    _train(first, 3, 1, recorded, epoch=0)  # 3 steps at 2 ranks, grad_accum 1
    state = first[0].state_dict()
    second = _loaders(url, 3, state=state, grad_accum=2, weights=weights)
    _train(second, 2, 2, recorded, epoch=0)  # 2 steps at 3 ranks, grad_accum 2
    _train(second, 2, 2, recorded, epoch=1)  # a new epoch: a second pass in the history
    doc = _doc(url, weights, second, recorded, 2)
    for step, per_rank in recorded.items():
        samples = samples_of_step(doc, step)
        got = {r: [s.key for s in samples if s.rank == r] for r in per_rank}
        assert got == per_rank, step
    one = samples_of_step(doc, 4, ranks=[2])
    assert {s.rank for s in one} == {2} and len(one) == 2 * B and all(s.label is not None for s in one)


def test_which_refuses_steps_outside_the_history_and_a_rewritten_dataset(datasets, tmp_path):
    recorded: dict[int, dict[int, list[str]]] = {}
    loaders = _loaders(datasets[0], 1)
    _train(loaders, 2, 1, recorded, epoch=0)
    doc = _doc(datasets[0], None, loaders, recorded, 1)
    with pytest.raises(ValueError, match=r"step 3 is outside .*1\.\.2"):
        samples_of_step(doc, 3)
    doc["sources"] = [{"url": datasets[1], "weight": None}]
    del doc["xxh3_128"]  # (else refused as changed after it was written: test_which_sidecar.py)
    with pytest.raises(StateError, match="rewritten or appended"):
        samples_of_step(doc, 1)
