"""What one token worker does: its plan's windows read (readers/tokens.py), sequences packed into batches.

A batch of B sequences of seq_len L (every tensor a fresh one the caller may keep):
    input_ids     [B, L+1] int64   tokens; inputs are [:, :-1], next-token labels [:, 1:]
    position_ids  [B, L+1] int64   0 at the row's start and at each document start within it
    doc_ids       [B, L+1] int64   global document number (manifest order); -1 on padding
    loss_mask     [B, L+1] bool    a real token of a real (not repeated) sequence
    mask          [B]      bool    False for a tail="pad" repeat
Each row is copied once from the memory map (or a ranged read) into `input_ids`, widened to int64 by
the same assignment. With fields=("input_ids",) the document fields are left out (no offsets read).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataio.plan.tokens import SequenceOrder, TokenPlanConfig, TokenWindow, plan_token_worker
from dataio.plan.types import PlanState, WorkerSlot
from dataio.readers.tokens import Piece, TokenShards

TOKEN_FIELDS = ("input_ids", "position_ids", "doc_ids", "loss_mask", "mask")


@dataclass(frozen=True, kw_only=True)
class TokenJob:
    """Everything a token worker needs; the same on every worker of every rank."""

    shards: TokenShards
    config: TokenPlanConfig
    doc_lengths: tuple[np.ndarray, ...]  # per shard: what the plan cuts (concat: one entry, the shard's tokens)
    with_docs: bool = True  # position_ids and doc_ids
    pad_id: int = 0
    prefetch_bytes: int = 128 << 20
    max_in_flight: int = 8


class _Rows:
    """The batch being filled: numpy views of fresh tensors."""

    def __init__(self, batch_size: int, width: int, with_docs: bool) -> None:
        self.tensors: dict[str, torch.Tensor] = {
            "input_ids": torch.empty((batch_size, width), dtype=torch.int64),
            "loss_mask": torch.zeros((batch_size, width), dtype=torch.bool),
            "mask": torch.ones(batch_size, dtype=torch.bool),
        }
        if with_docs:
            self.tensors["position_ids"] = torch.zeros((batch_size, width), dtype=torch.int64)
            self.tensors["doc_ids"] = torch.full((batch_size, width), -1, dtype=torch.int64)
        self.np = {k: v.numpy() for k, v in self.tensors.items()}
        self.filled = 0


def worker_batches(job: TokenJob, slot: WorkerSlot, state: PlanState) -> Iterator[dict[str, Any]]:
    """This worker's batches from `state` on, in its plan's order (rank batch j from worker j % num_workers)."""
    plan = plan_token_worker(job.doc_lengths, config=job.config, slot=slot, state=state)
    B, width = job.config.plan.batch_size, job.config.seq_len + 1
    rows = _Rows(B, width, job.with_docs)
    reads = job.shards.windows((w.segments for w in plan.windows), budget_bytes=job.prefetch_bytes,
                               max_in_flight=job.max_in_flight)
    for window, pieces in zip(plan.windows, reads):
        lookup = _PieceLookup(pieces, plan.order)
        for i in range(len(window.stream_starts)):
            _fill_row(job, rows, rows.filled, lookup, window, i)
            rows.filled += 1
            if rows.filled == B:
                yield rows.tensors
                rows = _Rows(B, width, job.with_docs)
    assert rows.filled == 0, "a worker's sequences are whole batches"


class _PieceLookup:
    """A window's pieces by their place in the epoch's stream of tokens."""

    def __init__(self, pieces: list[Piece], order: SequenceOrder) -> None:
        self.pieces = pieces
        starts, place = order.shards.starts, order.shards.place
        self.lo = np.asarray([int(starts[place[p.shard]]) + p.start for p in pieces], dtype=np.int64)

    def first(self, stream_pos: int) -> int:
        return int(np.searchsorted(self.lo, stream_pos, side="right") - 1)


def _fill_row(job: TokenJob, rows: _Rows, r: int, lookup: _PieceLookup, window: TokenWindow, i: int) -> None:
    """Row r of the batch: sequence i of the window, copied from its pieces; padding after it."""
    s, n = int(window.stream_starts[i]), int(window.num_tokens[i])
    ids = rows.np["input_ids"][r]
    run_starts: list[np.ndarray] = []
    run_docs: list[np.ndarray] = []
    k, done = lookup.first(s), 0
    while done < n:
        piece = lookup.pieces[k]
        a = s + done - int(lookup.lo[k])
        take = min(n - done, len(piece.tokens) - a)
        assert take > 0, "the plan's segments cover every sequence"
        ids[done:done + take] = piece.tokens[a:a + take]  # the one copy, widened to int64 on the way
        if job.with_docs:
            starts, docs = _doc_runs(job.shards, piece.shard, piece.start + a, piece.start + a + take)
            run_starts.append(starts + done)
            run_docs.append(docs)
        done += take
        k += 1
    ids[n:] = job.pad_id
    real = not bool(window.is_pad[i])
    rows.np["loss_mask"][r, :n] = real
    rows.np["loss_mask"][r, n:] = False
    rows.np["mask"][r] = real
    if job.with_docs:
        _fill_docs(rows, r, n, np.concatenate(run_starts), np.concatenate(run_docs))


def _doc_runs(shards: TokenShards, shard: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(start relative to lo, global document number) of each document run within tokens [lo, hi) of a shard."""
    offsets = shards.offsets(shard)
    d0 = int(np.searchsorted(offsets, lo, side="right") - 1)
    d1 = int(np.searchsorted(offsets, hi, side="left"))  # the documents starting before hi: d0 .. d1 - 1
    starts = np.maximum(offsets[d0:d1], lo) - lo
    return starts, shards.doc_base[shard] + np.arange(d0, d1, dtype=np.int64)


def _fill_docs(rows: _Rows, r: int, n: int, starts: np.ndarray, docs: np.ndarray) -> None:
    """position_ids restart at 0 at the row's start and at each document start; doc_ids per run."""
    lengths = np.diff(np.append(starts, n))
    rows.np["doc_ids"][r, :n] = np.repeat(docs, lengths)
    rows.np["doc_ids"][r, n:] = -1
    rows.np["position_ids"][r, :n] = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    rows.np["position_ids"][r, n:] = 0
