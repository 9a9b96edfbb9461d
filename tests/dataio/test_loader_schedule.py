"""make_loader(weights=Schedule(...)) for both kinds of data the one loader reads: samples, and token
datasets (seq_len: shares counted in sequences). Exact per-piece counts in the batches, and a resume
mid-piece at another world size and worker count that delivers what the uninterrupted run delivers;
a piece that ran may not change, a later one may (noted)."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from dataio.errors import StateError
from dataio.loader.make import make_loader
from dataio.plan.schedule import Piece, Schedule
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.dataio.tokengen import write_token_dataset

pytestmark = pytest.mark.timeout(120)
B, SEQ_LEN = 2, 8
SCHEDULE = Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75))))  # 120 an epoch: segments 48 + 72
B_FIRST = 100_000  # the second token source's token values
# Per kind: the loader's own options, and what a batch row is: (source, sample key or sequence tokens).
OPTIONS = {"samples": dict(decode=None, shuffle_window=8), "tokens": dict(seq_len=SEQ_LEN, shuffle_window=5)}


@pytest.fixture(scope="module", params=["samples", "tokens"])
def urls(request, tmp_path_factory) -> tuple[str, list[str]]:
    a, b = (str(tmp_path_factory.mktemp(n) / "ds") for n in ("a", "b"))
    if request.param == "samples":
        write_tar_dataset(Store(a), [30, 30])
        write_tar_dataset(Store(b), [24, 36], seed=4)
    else:  # 481 tokens each
        write_token_dataset(Store(a), [[30, 50, 41], [9, 60, 1, 50], [80, 60, 100]], block_tokens=16)
        write_token_dataset(Store(b), [[120, 100], [61, 100, 100]], block_tokens=16, first_id=B_FIRST)
    return request.param, [a, b]


def _loaders(urls, world_size, num_workers, schedule=SCHEDULE, state=None):
    kind, paths = urls
    loaders = [make_loader(paths, weights=schedule, batch_size=B, num_workers=num_workers, rank=r,
                           world_size=world_size, seed=1, **OPTIONS[kind]) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(0)
    return loaders


def _rows(batch: dict) -> list[tuple[int, object]]:
    if "input_ids" in batch:  # a sequence: its real tokens
        return [(int(s), tuple(ids[keep].tolist()))
                for s, ids, keep in zip(batch["source"], batch["input_ids"], batch["loss_mask"])]
    return [(int(s), k) for s, k in zip(batch["source"].tolist(), batch["__key__"])]


def _run(loaders, steps=None) -> list[list[tuple[int, object]]]:
    """Per step, every rank's rows, rank by rank; all steps when `steps` is None."""
    its = [iter(loader) for loader in loaders]
    out = []
    for batches in zip(*its):
        out.append([row for b in batches for row in _rows(b)])
        if steps is not None and len(out) == steps:
            break
    for it in its:
        it.close()
    return out


def test_each_piece_gets_its_exact_shares_and_a_mid_piece_resume_delivers_the_rest(urls):
    whole = _run(_loaders(urls, 2, 2))
    flat = [x for step in whole for x in step]
    assert len(flat) == 120
    assert Counter(s for s, _ in flat[:48]) == {0: 36, 1: 12}  # piece 0: 0.75 / 0.25 of 48
    assert Counter(s for s, _ in flat[48:]) == {0: 18, 1: 54}  # piece 1 (to the epoch's end): 0.25 / 0.75 of 72
    if urls[0] == "tokens":
        for s, tokens in flat:  # every row holds its own source's tokens
            assert all((t >= B_FIRST) == (s == 1) for t in tokens)
        # source a's 54 sequences of its 60 are each delivered once (no pass ends within the epoch for it)
        a_rows = [tokens for s, tokens in flat if s == 0]
        assert len(set(a_rows)) == len(a_rows) == 54
    first = _loaders(urls, 2, 2)
    head = _run(first, steps=3)  # 12 rows into piece 0
    state = first[0].state_dict()
    rest = _run(_loaders(urls, 3, 1, state=state))
    assert Counter(x for step in head + rest for x in step) == Counter(flat)


def test_a_changed_piece_that_ran_is_refused_a_later_one_is_noted(urls):
    first = _loaders(urls, 2, 0)
    _run(first, steps=3)
    state = first[0].state_dict()
    past = Schedule((Piece((0.5, 0.5), 48), Piece((0.25, 0.75))))
    with pytest.raises(StateError, match="cannot resume: (schedule piece 0|source 0 .* had weight 0.75)"):
        _loaders(urls, 2, 0, schedule=past, state=state)
    future = Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75), 500), Piece((0.5, 0.5))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loaders(urls, 2, 0, schedule=future, state=state)
    assert any("changed mixture schedule: schedule piece 1" in str(w.message) for w in caught)
