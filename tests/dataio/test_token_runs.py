"""doc_ids and position_ids of token batches from their document runs: the C extension (one pass) and numpy's
fallback give what a per-token loop gives, and the extension refuses runs out of order."""

from __future__ import annotations

import numpy as np
import pytest

from dataio.stream import token_stream
from dataio.stream.token_stream import fill_runs

needs_c = pytest.mark.skipif(token_stream._token_runs is None, reason="dataio.stream._token_runs not built "
                             "(python setup.py build_ext --inplace)")


def reference(run_at: np.ndarray, run_doc: np.ndarray, num_rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    docs, pos = np.empty(num_rows * width, np.int64), np.empty(num_rows * width, np.int64)
    ends = list(run_at[1:]) + [num_rows * width]
    for lo, hi, doc in zip(run_at.tolist(), ends, run_doc.tolist()):
        for t in range(lo, hi):
            docs[t], pos[t] = doc, t - lo
    return docs.reshape(num_rows, width), pos.reshape(num_rows, width)


def random_runs(seed: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Every row starts a run; a few more runs inside rows, some of one token."""
    rng = np.random.default_rng(seed)
    num_rows, width = int(rng.integers(1, 6)), int(rng.integers(1, 40))
    inside = rng.integers(0, num_rows * width, int(rng.integers(0, 12)))
    run_at = np.unique(np.concatenate([np.arange(num_rows) * width, inside])).astype(np.int64)
    run_doc = rng.integers(-1, 1 << 40, len(run_at)).astype(np.int64)
    return run_at, run_doc, num_rows, width


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("use_c", [pytest.param(True, marks=needs_c), False])
def test_runs_give_each_token_its_document_and_offset(seed, use_c, monkeypatch) -> None:
    run_at, run_doc, num_rows, width = random_runs(seed)
    if not use_c:
        monkeypatch.setattr(token_stream, "_token_runs", None)
    docs, pos = np.full((num_rows, width), 7, np.int64), np.full((num_rows, width), 7, np.int64)
    fill_runs(run_at, run_doc, docs, pos)
    want_docs, want_pos = reference(run_at, run_doc, num_rows, width)
    assert (docs == want_docs).all() and (pos == want_pos).all()


@needs_c
@pytest.mark.parametrize("run_at,match", [([1, 3], "start at token 0"), ([0, 5, 2], "before its predecessor"),
                                          ([0, 99], "past the end")])
def test_the_extension_refuses_runs_out_of_order(run_at, match) -> None:
    at = np.asarray(run_at, dtype=np.int64)
    out = np.empty((2, 5), dtype=np.int64)
    with pytest.raises(ValueError, match=match):
        token_stream._token_runs.fill(at, np.zeros_like(at), out, out.copy())
    with pytest.raises(ValueError, match="int64"):
        token_stream._token_runs.fill(at.astype(np.int32), at.astype(np.int32), out, out.copy())
