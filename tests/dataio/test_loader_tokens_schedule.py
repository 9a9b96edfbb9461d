"""make_loader([a, b], weights=Schedule(...), seq_len=L): a token mixture whose token shares follow the
schedule's pieces (counted in sequences), exact per piece, and a resume mid-piece at another world size
and worker count that delivers what the uninterrupted run delivers."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest

from dataio.errors import StateError
from dataio.loader.make import make_loader
from dataio.plan.schedule import Piece, Schedule
from dataio.storage.store import Store
from tests.dataio.tokengen import write_token_dataset

pytestmark = pytest.mark.timeout(120)
SEQ_LEN, B = 8, 2
SCHEDULE = Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75))))  # 120 sequences an epoch: segments 48 + 72
B_FIRST = 100_000  # the second source's token values


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    a, b = (str(tmp_path_factory.mktemp(n) / "ds") for n in ("sa", "sb"))
    write_token_dataset(Store(a), [[30, 50, 41], [9, 60, 1, 50], [80, 60, 100]], block_tokens=16)  # 481 tokens
    write_token_dataset(Store(b), [[120, 100], [61, 100, 100]], block_tokens=16, first_id=B_FIRST)  # 481 tokens
    return [a, b]


def _loaders(urls, world_size, num_workers, schedule=SCHEDULE, state=None):
    loaders = [make_loader(urls, weights=schedule, seq_len=SEQ_LEN, batch_size=B, num_workers=num_workers, rank=r,
                           world_size=world_size, seed=1, shuffle_window=5) for r in range(world_size)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(0)
    return loaders


def _run(loaders, steps=None) -> list[list[tuple[int, tuple[int, ...]]]]:
    """Per step, every rank's sequences as (source, its tokens), rank by rank; all steps when `steps` is None."""
    its = [iter(loader) for loader in loaders]
    out = []
    for batches in zip(*its):
        out.append([(int(s), tuple(ids[keep].tolist())) for b in batches
                    for s, ids, keep in zip(b["source"], b["input_ids"], b["loss_mask"])])
        if steps is not None and len(out) == steps:
            break
    for it in its:
        it.close()
    return out


def test_each_piece_gets_its_exact_token_shares_and_a_mid_piece_resume_delivers_the_rest(urls):
    whole = _run(_loaders(urls, 2, 2))
    flat = [x for step in whole for x in step]
    assert len(flat) == 120
    assert Counter(s for s, _ in flat[:48]) == {0: 36, 1: 12}  # piece 0: 0.75 / 0.25 of 48 sequences
    assert Counter(s for s, _ in flat[48:]) == {0: 18, 1: 54}  # piece 1 (to the epoch's end): 0.25 / 0.75 of 72
    for s, tokens in flat:  # every row holds its own source's tokens
        assert all((t >= B_FIRST) == (s == 1) for t in tokens)
    # source a's 54 sequences of its 60 are each delivered once (no pass ends within the epoch for it)
    a_rows = [tokens for s, tokens in flat if s == 0]
    assert len(set(a_rows)) == len(a_rows) == 54
    first = _loaders(urls, 2, 2)
    head = _run(first, steps=3)  # 12 sequences into piece 0
    state = first[0].state_dict()
    rest = _run(_loaders(urls, 3, 1, state=state))
    assert Counter(x for step in head + rest for x in step) == Counter(flat)


def test_a_changed_piece_that_ran_is_refused_a_later_one_is_noted(urls):
    first = _loaders(urls, 1, 1)
    _run(first, steps=3)
    state = first[0].state_dict()
    with pytest.raises(StateError, match="cannot resume: (schedule piece 0|source 0 .* had weight 0.75)"):
        _loaders(urls, 1, 1, schedule=Schedule((Piece((0.5, 0.5), 48), Piece((0.25, 0.75)))), state=state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loaders(urls, 1, 1, schedule=Schedule((Piece((0.75, 0.25), 48), Piece((0.25, 0.75), 500), Piece((1, 1)))),
                 state=state)
    assert any("changed mixture schedule" in str(w.message) for w in caught)
