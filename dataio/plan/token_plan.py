"""The token plan: which token ranges each (rank, worker) reads in an epoch, as sequences of seq_len + 1.

A pure function of the documents' token counts per shard, config, slot and resume state: no
I/O, no torch. The unit of the sample plan (plan.py) becomes the sequence: level 0 of an epoch is
the shards permuted by (seed, epoch), their documents concatenated in stored order (the "stream"),
cut into sequences; `plan_positions` then gives every (rank, worker) its contiguous run of
sequences, shuffled within windows, resumable at any topology, with equal steps. So the five
properties hold in sequences, and through the cut below, in tokens.

Packing (seq_len L; a sequence reads up to L + 1 tokens, inputs and the next-token labels):
  concat   sequence j reads stream tokens [j*L, j*L + L + 1): consecutive sequences share one token
           (the last label of j is the first input of j + 1); the last one may be shorter (padded)
  aligned  each document of n tokens gives max(1, ceil((n - 1) / L)) sequences, piece k reading
           [k*L, min(k*L + L + 1, n)) of it: every sequence starts at a document start or at a split
           of a long one; the rest of the L + 1 is padding (masked)
Each sequence "owns" the tokens it reads but the last one when the next sequence of its document
(aligned) or of the stream (concat) starts there: owned ranges partition the epoch's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataio.plan.permute import ShardOrder, epoch_shard_key, num_batches
from dataio.plan.plan import Window, plan_positions, steps_of_total
from dataio.plan.types import PlanConfig, PlanState, Segment, WorkerSlot

PACKINGS = ("concat", "aligned")


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenPlanConfig:
    """seq_len and packing, and the sample plan's config counted in sequences (batch_size sequences
    per rank batch, shuffle_window sequences)."""

    seq_len: int
    packing: str = "concat"
    plan: PlanConfig

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int | np.integer) or self.seq_len < 1:
            raise ValueError(f"seq_len must be an int >= 1, got {self.seq_len!r}")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {PACKINGS}, got {self.packing!r}")


def _lengths(doc_lengths: Sequence[Sequence[int]]) -> list[np.ndarray]:
    out = []
    for i, lengths in enumerate(doc_lengths):
        arr = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if (arr < 1).any():
            raise ValueError(f"shard {i}: every document holds at least one token (its EOS)")
        out.append(arr)
    return out


class SequenceOrder:
    """Level 0 of a token epoch: stream positions of the shards in (seed, epoch) order, cut into sequences.

    Global token id = the token's position in the shards concatenated in manifest order."""

    def __init__(self, doc_lengths: Sequence[Sequence[int]], config: TokenPlanConfig, epoch: int) -> None:
        docs = _lengths(doc_lengths)
        sizes = np.asarray([int(d.sum()) for d in docs], dtype=np.int64)
        self.shards = ShardOrder(sizes, epoch_shard_key(config.plan, epoch))
        self.seq_len, self.num_tokens = config.seq_len, int(sizes.sum())
        L = config.seq_len
        if config.packing == "concat":
            self._docs = None
            self.num_sequences = -(-max(self.num_tokens - 1, 1) // L) if self.num_tokens else 0
            return
        # (D,) document lengths in stream order; where each starts; its first sequence number
        lengths = np.concatenate([docs[s] for s in self.shards.order.tolist()] or [np.zeros(0, np.int64)])
        if len(lengths) and int(lengths.max()) < L:
            raise ValueError(f"seq_len {L} is larger than every document (the longest holds {int(lengths.max())} "
                             "tokens): aligned packing would pad every sequence; use packing='concat' or a "
                             "smaller seq_len")
        pieces = np.maximum(1, -(-(lengths - 1) // L))
        self._docs = (lengths, np.concatenate([[0], np.cumsum(lengths)]), np.concatenate([[0], np.cumsum(pieces)]))
        self.num_sequences = int(self._docs[2][-1])

    def sequences(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(stream start, tokens read, tokens owned) of sequences `pos` ((m,) int64 each)."""
        pos, L = np.asarray(pos, dtype=np.int64), self.seq_len
        if self._docs is None:
            start = pos * L
            n = np.minimum(L + 1, self.num_tokens - start)
            return start, n, np.where(start + n < self.num_tokens, np.minimum(n, L), n)
        lengths, doc_starts, first_seq = self._docs
        doc = np.searchsorted(first_seq, pos, side="right") - 1
        k = pos - first_seq[doc]
        n = np.minimum(L + 1, lengths[doc] - k * L)
        last = k == first_seq[doc + 1] - first_seq[doc] - 1
        return doc_starts[doc] + k * L, n, np.where(last, n, np.minimum(n, L))

    def token_ids(self, stream_start: int, num: int) -> np.ndarray:
        """Global token ids of stream positions [stream_start, stream_start + num)."""
        return self.shards.ids(np.arange(stream_start, stream_start + num, dtype=np.int64))

    def segments(self, starts: np.ndarray, counts: np.ndarray) -> tuple[Segment, ...]:
        """Reads covering stream ranges [starts, starts + counts): merged where they touch or overlap,
        cut at shard boundaries, in stream order; Segment start/stop count tokens of the shard."""
        if len(starts) == 0:
            return ()
        order = np.argsort(starts, kind="stable")
        lo, hi = starts[order], (starts + counts)[order]
        reach = np.maximum.accumulate(hi)
        heads = np.concatenate([[0], np.flatnonzero(lo[1:] > reach[:-1]) + 1])
        ends = np.append(heads[1:], len(lo)) - 1
        out: list[Segment] = []
        bounds, shard_of = self.shards.starts, self.shards.order
        for a, b in zip(lo[heads].tolist(), reach[ends].tolist()):
            while a < b:
                i = int(np.searchsorted(bounds, a, side="right") - 1)
                stop = min(b, int(bounds[i + 1]))
                out.append(Segment(shard=int(shard_of[i]), start=a - int(bounds[i]), stop=stop - int(bounds[i])))
                a = stop
        return tuple(out)


@dataclass(frozen=True, kw_only=True)
class SequenceGroup:
    """Sequences of one window that come from one pass of one source: read by segments[first:end]."""

    source: int  # 0 for a single dataset
    order: SequenceOrder  # that pass's level 0 (its segments' shards are the source's own numbers)
    first: int
    end: int


@dataclass(frozen=True, kw_only=True)
class TokenWindow:
    """One shuffle window of sequences: what to read, then each sequence in delivery order, and the
    group (source and pass) each belongs to: one group for a single dataset, so readers have one path."""

    segments: tuple[Segment, ...]  # reads in stream order (token ranges of shards)
    stream_starts: np.ndarray  # (m,) int64: each sequence's first token in its group's stream
    num_tokens: np.ndarray  # (m,) int64 tokens read, <= seq_len + 1 (the rest is padding)
    num_owned: np.ndarray  # (m,) int64 tokens of the sequence no other sequence owns
    is_pad: np.ndarray  # (m,) bool: a repeat for tail="pad", not a new sequence
    groups: tuple[SequenceGroup, ...]
    group: np.ndarray  # (m,) int64 index into groups


@dataclass(frozen=True, kw_only=True)
class TokenWorkerPlan:
    """One worker's batches of sequences from the state's position to the epoch's end."""

    num_steps: int
    batch_numbers: np.ndarray  # (n,) int64; rank batch j comes from worker j % num_workers
    windows: tuple[TokenWindow, ...]
    order: SequenceOrder | None  # maps stream positions to shards and token ids (None: a mixture's windows
    # carry their own orders, plan/token_mix.py)


def token_num_steps(doc_lengths: Sequence[Sequence[int]], *, config: TokenPlanConfig, world_size: int,
                    state: PlanState) -> int:
    """Batches of sequences every rank delivers from the state's position to the epoch's end."""
    order = SequenceOrder(doc_lengths, config, state.epoch)
    return steps_of_total(order.num_sequences, config=config.plan, world_size=world_size, state=state)


def plan_token_worker(doc_lengths: Sequence[Sequence[int]], *, config: TokenPlanConfig, slot: WorkerSlot,
                      state: PlanState) -> TokenWorkerPlan:
    """The sequences one worker reads and delivers, window by window, from the state's position on."""
    order = SequenceOrder(doc_lengths, config, state.epoch)
    windows: list[TokenWindow] = []

    def make_window(pos: np.ndarray, is_pad: np.ndarray) -> Window:
        starts, counts, owned = order.sequences(pos)
        segments = order.segments(starts, counts)
        whole = SequenceGroup(source=0, order=order, first=0, end=len(segments))
        windows.append(TokenWindow(segments=segments, stream_starts=starts, num_tokens=counts, num_owned=owned,
                                   is_pad=is_pad, groups=(whole,), group=np.zeros(len(pos), dtype=np.int64)))
        return Window(segments=(), sample_ids=pos, is_pad=is_pad)

    plan = plan_positions(order.num_sequences, config=config.plan, slot=slot, state=state, make_window=make_window)
    return TokenWorkerPlan(num_steps=plan.num_steps, batch_numbers=plan.batch_numbers, windows=tuple(windows),
                           order=order)


def sequences_per_epoch(doc_lengths: Sequence[Sequence[int]], config: TokenPlanConfig, world_size: int) -> int:
    """Sequences every rank delivers in a whole epoch (num_steps x batch_size)."""
    order = SequenceOrder(doc_lengths, config, 0)
    return num_batches(order.num_sequences, world_size, config.plan) * config.plan.batch_size
