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


@needs_c
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("seed", range(10))
def test_rows_copied_by_the_extension_are_numpys(dtype, seed) -> None:
    """copy_rows: each row its tokens widened to int64 (the full range of the dtype), then the pad id."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, np.iinfo(dtype).max, 500, endpoint=True).astype(dtype)
    num_rows, width = 6, int(rng.integers(1, 30))
    rows = rng.permutation(num_rows)[:int(rng.integers(1, num_rows + 1))].astype(np.int64)
    counts = rng.integers(0, width + 1, len(rows)).astype(np.int64)
    starts = rng.integers(0, len(src) - width, len(rows)).astype(np.int64)
    got, want = np.full((num_rows, width), 7, np.int64), np.full((num_rows, width), 7, np.int64)
    token_stream._token_runs.copy_rows(src, got, width, rows, starts, counts, -3)
    for r, a, n in zip(rows, starts, counts):
        want[r, :n], want[r, n:] = src[a:a + n], -3
    assert (got == want).all()


@needs_c
@pytest.mark.parametrize("src,rows,starts,counts,match", [
    (np.arange(10, dtype=np.uint16), [3], [0], [2], "outside dst or src"),
    (np.arange(10, dtype=np.uint16), [0], [8], [4], "outside dst or src"),
    (np.arange(10, dtype=np.uint16), [0], [0], [6], "outside dst or src"),  # more than the width
    (np.arange(10, dtype=">u2"), [0], [0], [2], "uint16 or uint32"),  # big-endian: not widened as read
    (np.arange(10, dtype=np.int64), [0], [0], [2], "uint16 or uint32"),
])
def test_the_extension_refuses_rows_outside_its_buffers(src, rows, starts, counts, match) -> None:
    dst = np.zeros((3, 5), dtype=np.int64)
    rows, starts, counts = (np.asarray(v, dtype=np.int64) for v in (rows, starts, counts))
    with pytest.raises(ValueError, match=match):
        token_stream._token_runs.copy_rows(src, dst, 5, rows, starts, counts, 0)
    assert not dst.any(), "nothing written before the check"
