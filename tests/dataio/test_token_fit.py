"""A token dataset smaller than one global batch: make_loader warns, naming seq_len, instead of giving 0
batches silently (issue 32); the arithmetic alone (plan/token_fit.py)."""

from __future__ import annotations

import warnings

import pytest

from dataio import make_loader
from dataio.plan.token_fit import token_shortfall
from dataio.storage.store import Store
from tests.dataio.tokengen import write_token_dataset


def test_the_shortfall_arithmetic() -> None:
    assert token_shortfall(num_tokens=3_759, seq_len=100_000, batch_size=4, world_size=1, tail="drop") == (
        "the dataset holds 3759 tokens, fewer than one global batch of sequences needs (1 rank(s) x batch_size 4 x "
        "seq_len 100000 = 400000): an epoch gives no batch; lower seq_len (or batch_size), or use fewer ranks")
    assert token_shortfall(num_tokens=64, seq_len=16, batch_size=2, world_size=2, tail="drop") is None
    assert token_shortfall(num_tokens=63, seq_len=16, batch_size=2, world_size=2, tail="drop") is not None
    assert token_shortfall(num_tokens=10, seq_len=16, batch_size=2, world_size=2, tail="pad") is None
    assert token_shortfall(num_tokens=10, seq_len=16, batch_size=2, world_size=2, tail="drop", packing="aligned") is None


def test_make_loader_warns_when_the_dataset_gives_no_batch(tmp_path) -> None:
    url = str(tmp_path / "ds")
    write_token_dataset(Store(url), [[100, 200], [300]])  # 600 tokens
    with pytest.warns(UserWarning, match=rf"{url}: the dataset holds 600 tokens, .*seq_len 1000 = 2000\)"):
        loader = make_loader(url, seq_len=1000, batch_size=2, num_workers=0)
    assert len(loader) == 0
    loader.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_loader(url, seq_len=100, batch_size=2, num_workers=0).close()
