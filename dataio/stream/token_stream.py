"""The token stream kind: one plan worker's windows of token ranges read (readers/token_shards.py) and
packed into batches of sequences. Packing is the only token-specific stage; the tickets, the DataLoader
dataset, the reader threads and worker processes are those of every stream (worker.py).

A batch of B sequences of seq_len L (every tensor a fresh one the caller may keep):
    input_ids     [B, L+1] int64   tokens; inputs are [:, :-1], next-token labels [:, 1:]
    position_ids  [B, L+1] int64   0 at the row's start and at each document start within it
    doc_ids       [B, L+1] int64   global document number (manifest order); -1 on padding
    loss_mask     [B, L+1] bool    a real token of a real (not repeated) sequence
    mask          [B]      bool    False for a tail="pad" repeat
    source        [B]      int64   a mixture's source of each sequence (mixtures only)
Each row is copied once from the memory map (or a ranged read) into `input_ids`, widened to int64 by
the same assignment. With fields=("input_ids",) the document fields are left out (no offsets read).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dataio.plan.token_mix import plan_token_mix_worker
from dataio.plan.token_plan import SequenceGroup, TokenWindow, TokenWorkerPlan
from dataio.plan.types import PlanState
from dataio.readers.token_shards import Piece, TokenSources
from dataio.stream.job import OpenJob, TokenSpec

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
    """The batch being filled: numpy views of fresh tensors."""

    def __init__(self, batch_size: int, width: int, with_docs: bool, mixed: bool) -> None:
        self.tensors: dict[str, torch.Tensor] = {
            "input_ids": torch.empty((batch_size, width), dtype=torch.int64),
            "loss_mask": torch.empty((batch_size, width), dtype=torch.bool),  # every element written per row
            "mask": torch.ones(batch_size, dtype=torch.bool),
        }
        if mixed:
            self.tensors["source"] = torch.zeros(batch_size, dtype=torch.int64)
        if with_docs:
            # Fresh memory is only written once: finish() fills every element of these.
            self.tensors["position_ids"] = torch.empty((batch_size, width), dtype=torch.int64)
            self.tensors["doc_ids"] = torch.empty((batch_size, width), dtype=torch.int64)
        self.np = {k: v.numpy() for k, v in self.tensors.items()}
        self.filled = 0
        # Document runs of the rows filled so far, for position_ids and doc_ids made per batch (finish):
        # each run's first token as a flat index into [B, L+1], its document; row r's real length.
        self.run_at: list[np.ndarray] = []
        self.run_doc: list[np.ndarray] = []
        self.lengths = np.zeros(batch_size, dtype=np.int64)

    def finish(self) -> dict[str, torch.Tensor]:
        """The batch, its position_ids and doc_ids made in a few passes over [B, L+1] (not per row)."""
        if "doc_ids" in self.np:
            B, W = self.np["doc_ids"].shape
            run_at = np.concatenate(self.run_at)  # ascending; every row has a run at its first token
            run_len = np.diff(np.append(run_at, B * W))
            # (B*W,) views: each token's document, its offset from its run's start (repeats, no scans)
            self.np["doc_ids"].reshape(-1)[:] = np.repeat(np.concatenate(self.run_doc), run_len)
            np.subtract(np.arange(B * W, dtype=np.int64), np.repeat(run_at, run_len),
                        out=self.np["position_ids"].reshape(-1))
            for r in np.flatnonzero(self.lengths < W).tolist():  # padding (aligned packing, a short tail)
                self.np["doc_ids"][r, self.lengths[r]:] = -1
                self.np["position_ids"][r, self.lengths[r]:] = 0
        return self.tensors


def packed_batches(opened: OpenJob, plan: TokenWorkerPlan) -> Iterator[dict[str, Any]]:
    """A worker plan's batches, in its order: its windows read ahead, each sequence packed into a row."""
    job, reader = opened.job, opened.token_reader
    spec = job.tokens
    assert spec is not None
    B, width, mixed = job.batch_size, spec.seq_len + 1, not job.mixture.single
    rows = _Rows(B, width, spec.with_docs, mixed)
    reads = reader.windows((w.segments for w in plan.windows), budget_bytes=job.prefetch_bytes,
                           max_in_flight=job.max_in_flight)
    try:
        for window, pieces in zip(plan.windows, reads):
            lookups = [_PieceLookup(pieces, g, reader) for g in window.groups]
            for i in range(len(window.stream_starts)):
                lookup = lookups[int(window.group[i])]
                _fill_row(spec, reader, rows, lookup, window, i)
                if mixed:
                    rows.np["source"][rows.filled] = lookup.source
                rows.filled += 1
                if rows.filled == B:
                    yield rows.finish()
                    rows = _Rows(B, width, spec.with_docs, mixed)
    finally:
        reads.close()  # type: ignore[attr-defined]  # its prefetch threads stop with the stream
    assert rows.filled == 0, "a worker's sequences are whole batches"


class _PieceLookup:
    """One group's pieces (a window holds one per source and pass) by their place in its pass's stream."""

    def __init__(self, pieces: list[Piece], group: SequenceGroup, reader: TokenSources) -> None:
        self.source = group.source
        self.pieces = pieces[group.first:group.end]
        starts, place = group.order.shards.starts, group.order.shards.place
        base = int(reader.shard_base[group.source])
        self.lo = np.asarray([int(starts[place[p.shard - base]]) + p.start for p in self.pieces], dtype=np.int64)

    def first(self, stream_pos: int) -> int:
        return int(self.lo.searchsorted(stream_pos, side="right")) - 1


def _fill_row(spec: TokenSpec, reader: TokenSources, rows: _Rows, lookup: _PieceLookup, window: TokenWindow,
              i: int) -> None:
    """The batch's next row: sequence i of the window, copied from its pieces; padding after it."""
    r = rows.filled
    s, n = int(window.stream_starts[i]), int(window.num_tokens[i])
    ids = rows.np["input_ids"][r]
    row_at = r * ids.shape[0]
    k, done = lookup.first(s), 0
    while done < n:
        piece = lookup.pieces[k]
        a = s + done - int(lookup.lo[k])
        take = min(n - done, len(piece.tokens) - a)
        assert take > 0, "the plan's segments cover every sequence"
        ids[done:done + take] = piece.tokens[a:a + take]  # the one copy, widened to int64 on the way
        if spec.with_docs:
            starts, docs = reader.doc_runs(piece.shard, piece.start + a, piece.start + a + take)
            rows.run_at.append(starts + (row_at + done))
            rows.run_doc.append(docs)
        done += take
        k += 1
    ids[n:] = spec.pad_id
    real = not bool(window.is_pad[i])
    rows.np["loss_mask"][r, :n] = real
    rows.np["loss_mask"][r, n:] = False
    rows.np["mask"][r] = real
    rows.lengths[r] = n
