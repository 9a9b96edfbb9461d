"""The token stream kind: one plan worker's windows of token ranges read (readers/token_shards.py) and
packed into batches of sequences. Packing is the only token-specific stage; the tickets, the DataLoader
dataset, the reader threads and worker processes are those of every stream (worker.py).

A batch of B sequences of seq_len L (every tensor the caller's to keep: its rows are never written again while
anything refers to them; made in process, a chunk's memory is reused once nothing does, slabs.StoragePool):
    input_ids     [B, L+1] int64   tokens; inputs are [:, :-1], next-token labels [:, 1:]
    position_ids  [B, L+1] int64   0 at the row's start and at each document start within it
    doc_ids       [B, L+1] int64   global document number (manifest order); -1 on padding
    loss_mask     [B, L+1] bool    a real token of a real (not repeated) sequence
    mask          [B]      bool    False for a tail="pad" repeat
    source        [B]      int64   a mixture's source of each sequence (mixtures only)
Each row is copied once from the memory map (or a ranged read) into `input_ids`, widened to int64 on the
way; position_ids and doc_ids are written once each from the rows' document runs. The optional C extension
_token_runs (setup.py) does each in one call; without it numpy makes the same batches in more passes.
With fields=("input_ids",) the document fields are left out (no offsets read).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dataio.plan.token_mix import plan_token_mix_worker
from dataio.plan.token_plan import SequenceGroup, TokenWindow, TokenWorkerPlan
from dataio.plan.types import PlanState
from dataio.readers.token_shards import Piece, TokenSources
from dataio.stream.job import OpenJob, TokenSpec
from dataio.stream.slabs import recycled_uint8

try:
    from dataio.stream import _token_runs  # C: rows copied, doc_ids and position_ids, one pass each (setup.py)
except ImportError:  # not built: numpy makes the same batches (a copy per row, a fill and a running sum per field)
    _token_runs = None

TOKEN_FIELDS = ("input_ids", "position_ids", "doc_ids", "loss_mask", "mask")


class TokenStream:
    """The batches of one plan worker for one iteration, in its plan's order (rank batch j from worker
    j % num_workers): the interface of every stream (worker.py), over packed sequences."""

    def __init__(self, opened: OpenJob, worker_id: int, state: PlanState) -> None:
        job = opened.job
        assert job.tokens is not None
        self.epoch, self.state, self.head = state.epoch, state, 0
        plan = plan_token_mix_worker(job.tokens.doc_lengths, job.mixture, config=job.token_config,
                                     slot=job.topology.slot(worker_id), state=state)
        self._numbers = plan.batch_numbers.tolist()
        self._packed = packed_batches(opened, plan)
        self._batches = zip(self._numbers, self._packed)
        self.finished = False

    def warm_up(self) -> None:
        """Nothing to lay out ahead: the first window's reads start with the first batch."""

    def batch(self, batch_index: int) -> dict[str, Any]:
        """The batch numbered `batch_index`; earlier ones of this worker not asked for are skipped."""
        for number, batch in self._batches:
            if number == batch_index:
                if number == self._numbers[-1]:
                    self.close()
                    self.finished = True
                return batch
            if number > batch_index:
                break
        raise RuntimeError(f"internal: token worker plan has no batch {batch_index} (it makes "
                           f"{self._numbers[:8]}...); please report this")

    def close(self) -> None:
        """Stop its reads (object storage: the prefetch threads)."""
        self._packed.close()


class _Rows:
    """The rows being filled: numpy views of the chunk's tensors (_chunk_tensors)."""

    def __init__(self, batch_size: int, width: int, with_docs: bool, mixed: bool, pooled: bool) -> None:
        self.capacity, self.width = batch_size, width
        self.tensors = _chunk_tensors(batch_size, width, with_docs, mixed, pooled)
        self.np = {k: v.numpy() for k, v in self.tensors.items()}
        self.filled = 0
        # Document runs of the rows filled so far, for position_ids and doc_ids made per chunk (finish):
        # each run's first token as a flat index into [B, L+1], its document; row r's real length.
        self.run_at: list[np.ndarray] = []
        self.run_doc: list[np.ndarray] = []
        self.lengths = np.zeros(batch_size, dtype=np.int64)

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """The filled rows as batches of `batch_size` rows: row slices of the chunk's tensors, each
        batch's rows its own (the next chunk is other memory)."""
        tensors = self.finish()
        for j in range(0, self.filled, batch_size):
            yield {k: v[j:j + batch_size] for k, v in tensors.items()}

    def finish(self) -> dict[str, torch.Tensor]:
        """The filled rows' position_ids and doc_ids, from their document runs (fill_runs)."""
        if "doc_ids" in self.np and self.filled:
            B, W = self.filled, self.width
            run_at = np.concatenate(self.run_at)  # every row has a run at its first token
            order = np.argsort(run_at, kind="stable")  # rows were filled group by group: put runs in place
            run_at, run_doc = run_at[order], np.concatenate(self.run_doc)[order]
            docs, pos = self.np["doc_ids"][:B], self.np["position_ids"][:B]  # (B, W) row prefixes: contiguous
            fill_runs(run_at, run_doc, docs, pos)
            for r in np.flatnonzero(self.lengths[:B] < W).tolist():  # padding (aligned packing, a short tail)
                docs[r, self.lengths[r]:] = -1
                pos[r, self.lengths[r]:] = 0
        return self.tensors


def _chunk_tensors(rows: int, width: int, with_docs: bool, mixed: bool, pooled: bool) -> dict[str, torch.Tensor]:
    """A chunk's tensors (rows of width), every element written before it leaves (source: zeros). `pooled`
    (batches made in this process): views of one StoragePool storage, reused only once the caller let go of
    every batch of the chunk (slabs.py): a fresh chunk's pages are otherwise faulted in again and again."""
    fields = [("input_ids", (rows, width), torch.int64), ("loss_mask", (rows, width), torch.bool),
              ("mask", (rows,), torch.bool)]
    if mixed:
        fields.append(("source", (rows,), torch.int64))
    if with_docs:
        fields += [("position_ids", (rows, width), torch.int64), ("doc_ids", (rows, width), torch.int64)]
    if not pooled:
        out = {name: torch.empty(shape, dtype=dtype) for name, shape, dtype in fields}
    else:
        sizes = [-(-math.prod(shape) * dtype.itemsize // 8) * 8 for _, shape, dtype in fields]  # 8-byte aligned
        buf, at, out = recycled_uint8(sum(sizes)), 0, {}
        for (name, shape, dtype), size in zip(fields, sizes):
            out[name] = buf[at:at + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            at += size
    if mixed:
        out["source"].zero_()
    return out


def fill_runs(run_at: np.ndarray, run_doc: np.ndarray, docs: np.ndarray, pos: np.ndarray) -> None:
    """doc_ids and position_ids ((B, W) int64, C-contiguous) of document runs: run i covers the flat tokens
    [run_at[i], run_at[i + 1]) (sorted, from 0; every row starts one), each of its tokens gets run_doc[i] and
    its offset in the run. One pass with the C extension; without it, numpy's fill and running sum per field."""
    if _token_runs is not None:
        _token_runs.fill(run_at, run_doc, docs, pos)
        return
    # (B*W,) views, each a running sum of steps placed at the runs' first tokens: doc_ids steps by the
    # change of document, position_ids by 1 but back to 0 at each run's start. No temporaries of [B, W].
    docs, pos = docs.reshape(-1), pos.reshape(-1)
    docs[:] = 0
    docs[run_at] = _steps(run_doc, 0)
    np.cumsum(docs, out=docs)
    pos[:] = 1
    pos[run_at] = 1 - _steps(run_at, run_at[0] - 1)  # back to 0: minus the last run's length - 1
    np.cumsum(pos, out=pos)


def _steps(values: np.ndarray, before: int) -> np.ndarray:
    """values[i] - values[i - 1], `before` standing for values[-1] (np.diff's prepend, without its overhead)."""
    out = np.empty_like(values)
    out[0] = values[0] - before
    np.subtract(values[1:], values[:-1], out=out[1:])
    return out


#: Rows are filled and finished in chunks of up to this many batches, then handed out as row slices: the
#: per-batch cost of allocating and finishing (a few dozen numpy calls) is paid once per chunk. The first
#: chunk is one batch (the first batch's latency), each next one twice the last.
CHUNK_BATCHES = 8


def packed_batches(opened: OpenJob, plan: TokenWorkerPlan) -> Iterator[dict[str, Any]]:
    """A worker plan's batches, in its order: its windows read ahead, each sequence packed into a row."""
    job, reader = opened.job, opened.token_reader
    spec = job.tokens
    assert spec is not None
    B, width, mixed, pooled = job.batch_size, spec.seq_len + 1, not job.mixture.single, job.pooled_reads
    chunk = 1
    rows = _Rows(B * chunk, width, spec.with_docs, mixed, pooled)
    reads = reader.windows((w.segments for w in plan.windows), budget_bytes=job.prefetch_bytes,
                           max_in_flight=job.max_in_flight)
    try:
        for window, pieces in zip(plan.windows, reads):
            lookups = [_PieceLookup(pieces, g, reader) for g in window.groups]
            i, m = 0, len(window.stream_starts)
            while i < m:  # the window's sequences into rows, as many at a time as the batch has room for
                take = min(rows.capacity - rows.filled, m - i)
                _fill_rows(spec, reader, rows, lookups, window, i, i + take)
                i += take
                if rows.filled == rows.capacity:
                    yield from rows.batches(B)
                    chunk = min(2 * chunk, CHUNK_BATCHES)
                    rows = _Rows(B * chunk, width, spec.with_docs, mixed, pooled)
        assert rows.filled % B == 0, "a worker's sequences are whole batches"
        yield from rows.batches(B)
    finally:
        reads.close()  # type: ignore[attr-defined]  # its prefetch threads stop with the stream


class _PieceLookup:
    """One group's pieces (a window holds one per source and pass) by their place in its pass's stream."""

    def __init__(self, pieces: list[Piece], group: SequenceGroup, reader: TokenSources) -> None:
        self.source = group.source
        self.pieces = pieces[group.first:group.end]
        starts, place = group.order.shards.starts, group.order.shards.place
        base = int(reader.shard_base[group.source])
        self.lo = np.asarray([int(starts[place[p.shard - base]]) + p.start for p in self.pieces], dtype=np.int64)
        self.length = np.asarray([len(p.tokens) for p in self.pieces], dtype=np.int64)
        self.start = np.asarray([p.start for p in self.pieces], dtype=np.int64)  # in its shard
        self.shard = np.asarray([p.shard for p in self.pieces], dtype=np.int64)  # global

    def first(self, stream_pos: int) -> int:
        return int(self.lo.searchsorted(stream_pos, side="right")) - 1


def _fill_rows(spec: TokenSpec, reader: TokenSources, rows: _Rows, lookups: list[_PieceLookup],
               window: TokenWindow, i0: int, i1: int) -> None:
    """The batch's next rows: sequences i0..i1-1 of the window, each copied from its piece (once, widened
    to int64 on the way), padding after it; their document runs found for all rows of a group and shard
    at once. A sequence that spans pieces (a shard's end) takes the per-row path."""
    r0, W = rows.filled, rows.np["input_ids"].shape[1]
    s, n = window.stream_starts[i0:i1], window.num_tokens[i0:i1]
    group = window.group[i0:i1]
    for g, lookup in enumerate(lookups):  # one group (source and pass) for a single dataset
        sel = np.arange(len(s)) if len(lookups) == 1 else (group == g).nonzero()[0]  # (c,) its rows, from r0
        if not len(sel):
            continue
        k = lookup.lo.searchsorted(s[sel], side="right") - 1  # (c,) each row's first piece
        a = s[sel] - lookup.lo[k]  # (c,) where it starts in that piece
        whole = a + n[sel] <= lookup.length[k]
        _copy_ids(spec, reader, rows, lookup, r0, sel, s, n, k, a, whole)
        if whole.any():
            kw, first = k[whole], lookup.start[k[whole]] + a[whole]  # shard-local token ranges of whole rows
            last = first + n[sel[whole]]
            at = (r0 + sel[whole]) * W  # (c',) each row's first token, flat in [B, W]
            shards = lookup.shard[kw]
            one = bool((shards == shards[0]).all())  # the usual batch: all its rows in one shard
            for shard in ([int(shards[0])] if one else np.unique(shards).tolist()):
                on = shards == shard
                reader.check_ranges(shard, first[on], last[on])  # what this batch copied, before it leaves
                if spec.with_docs:
                    ranges, starts, docs = reader.doc_runs_many(shard, first[on], last[on])
                    rows.run_at.append(starts + at[on][ranges])
                    rows.run_doc.append(docs)
        if "source" in rows.np:  # a mixture's
            rows.np["source"][r0 + sel] = lookup.source
    real = ~window.is_pad[i0:i1]
    rows.np["loss_mask"][r0:r0 + len(s)] = real[:, None]  # a memset per row; padding after it below
    for j in (n < W).nonzero()[0].tolist():
        rows.np["loss_mask"][r0 + j, n[j]:] = False
    rows.np["mask"][r0:r0 + len(s)] = real
    rows.lengths[r0:r0 + len(s)] = n
    rows.filled += len(s)


def _copy_ids(spec: TokenSpec, reader: TokenSources, rows: _Rows, lookup: _PieceLookup, r0: int, sel: np.ndarray,
              s: np.ndarray, n: np.ndarray, k: np.ndarray, a: np.ndarray, whole: np.ndarray) -> None:
    """Rows r0 + sel: sequences s[sel] (n[sel] tokens; piece k, from a in it), each copied once from its
    piece, widened to int64 on the way, padding after it: one C call per piece where the extension is built,
    a row at a time otherwise. A sequence that spans pieces (whole False: a shard's end) goes row by row."""
    ids, W, pad_id = rows.np["input_ids"], rows.width, spec.pad_id
    if _token_runs is not None and whole.all():  # the usual group: every row inside a piece
        if (k == k[0]).all():
            _token_runs.copy_rows(lookup.pieces[int(k[0])].tokens, ids, W, r0 + sel, a, n[sel], pad_id)
            return
        for kk in np.unique(k).tolist():
            on = k == kk
            _token_runs.copy_rows(lookup.pieces[kk].tokens, ids, W, r0 + sel[on], a[on], n[sel][on], pad_id)
        return
    for j, kk, aa, nn, ok in zip(sel.tolist(), k.tolist(), a.tolist(), n[sel].tolist(), whole.tolist()):
        if ok:
            ids[r0 + j, :nn] = lookup.pieces[kk].tokens[aa:aa + nn]
        else:
            _fill_spanning(spec, reader, rows, lookup, r0 + j, int(s[j]), nn)
        if nn < W:
            ids[r0 + j, nn:] = pad_id


def _fill_spanning(spec: TokenSpec, reader: TokenSources, rows: _Rows, lookup: _PieceLookup, r: int, s: int,
                   n: int) -> None:
    """Row r: the n tokens from stream position s, copied piece by piece (it spans a piece's end)."""
    ids = rows.np["input_ids"][r]
    row_at = r * ids.shape[0]
    k, done = lookup.first(s), 0
    while done < n:
        piece = lookup.pieces[k]
        a = s + done - int(lookup.lo[k])
        take = min(n - done, len(piece.tokens) - a)
        assert take > 0, "the plan's segments cover every sequence"
        ids[done:done + take] = piece.tokens[a:a + take]
        lo = np.asarray([piece.start + a], dtype=np.int64)
        reader.check_ranges(piece.shard, lo, lo + take)
        if spec.with_docs:
            starts, docs = reader.doc_runs(piece.shard, piece.start + a, piece.start + a + take)
            rows.run_at.append(starts + (row_at + done))
            rows.run_doc.append(docs)
        done += take
        k += 1
