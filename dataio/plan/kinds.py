"""Mixtures across kinds: datasets of samples (image-label), image-text pairs and tokens in one epoch,
each batch of one kind. Pure, like mix.py: no I/O, no torch.

Samples of different kinds cannot share a batch (an image batch and a batch of packed sequences have
different fields), so the kinds are mixed by whole steps: every kind is a loader of its own (a mixture
of its sources, plan/mix.py or plan/token_mix.py) whose epoch is its count of the epoch's samples (a
token dataset's sample is one packed sequence), split by weight as mix.py splits samples between
sources; at every step all ranks take the next batch of the same kind. Which kind comes next is the
interleaving (interleave.py, within 1 of the shares over every prefix) of the kinds' remaining steps,
so the batches of each kind follow its share of the samples, and the five properties are the kinds'
own: every kind's plan keeps exactly once, equal steps and locality; the order is a function of the
kinds' step counts; and the state is each kind's state plus this order's (its counts and how many of
them were delivered). A resume at the topology that saved it continues the same order; at another, the
kinds' remaining steps at the new topology are interleaved afresh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dataio.errors import StateError
from dataio.plan.interleave import Interleave
from dataio.plan.mix import MixSource, Mixture
from dataio.plan.schedule import Piece

KINDS = ("samples", "pairs", "tokens")  # an image-label (or any samples) dataset, image-text pairs, tokens


def kind_counts(sizes: Sequence[int], weights: Sequence[float], kinds: Sequence[str],
                epoch_samples: int | None) -> dict[str, int]:
    """Each kind's samples per epoch: the epoch (default: every source's size summed, a token source's in
    sequences) split between the kinds by their sources' summed weights, by largest remainder (mix.py)."""
    order = list(dict.fromkeys(kinds))
    per_kind = [MixSource(name=k, shard_sizes=[sum(int(n) for n, kk in zip(sizes, kinds) if kk == k)],
                          weight=sum(float(w) for w, kk in zip(weights, kinds) if kk == k)) for k in order]
    total = sum(int(n) for n in sizes) if epoch_samples is None else epoch_samples
    counts = Mixture(sources=tuple(per_kind), epoch_samples=total).counts
    return {k: int(c) for k, c in zip(order, counts)}


def kind_pieces(pieces: Sequence[Piece], kinds: Sequence[str], names: Sequence[str]) -> dict[str, tuple[Piece, ...] | None]:
    """A schedule's pieces as each kind's own: the weights of its sources, lasting the kind's share of
    the piece's samples. The kinds' shares must stay those of the first piece (a kind's epoch is fixed);
    ValueError naming the piece and the shares otherwise. None for a kind of one source (nothing to move)."""
    order = list(dict.fromkeys(kinds))

    def shares(piece: Piece) -> list[float]:
        total = sum(piece.weights)
        return [sum(w for w, k in zip(piece.weights, kinds) if k == kind) / total for kind in order]

    first = shares(pieces[0])
    for i, piece in enumerate(pieces):
        if len(piece.weights) != len(kinds):
            raise ValueError(f"schedule piece {i} has {len(piece.weights)} weights for {len(kinds)} sources {list(names)}")
        if not np.allclose(shares(piece), first, rtol=1e-9, atol=1e-12):
            raise ValueError(f"schedule piece {i} gives the kinds {order} shares {shares(piece)}, the first piece "
                             f"{first}: a mixture across kinds keeps each kind's share; let pieces move weight only "
                             "between sources of one kind")
    out: dict[str, tuple[Piece, ...] | None] = {}
    for kind, share in zip(order, first):
        members = [i for i, k in enumerate(kinds) if k == kind]
        if len(members) == 1 or share == 0:
            out[kind] = None
            continue
        out[kind] = tuple(Piece(weights=tuple(p.weights[i] for i in members),
                                samples=None if p.samples is None else max(1, round(p.samples * share)))
                          for p in pieces)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class KindOrder:
    """Which kind makes each of the steps left: the interleaving of `counts` (steps per kind, from the
    position it was started at), of which `delivered` are gone."""

    counts: tuple[int, ...]
    delivered: int = 0

    @classmethod
    def fitted(cls, saved: KindOrder | None, remaining: Sequence[int]) -> KindOrder:
        """The saved order where it leaves exactly the kinds' `remaining` steps (the same topology), else
        a new one over them (a new epoch, or another world size)."""
        remaining = tuple(int(r) for r in remaining)
        if saved is not None and saved.left() == remaining:
            return saved
        return cls(counts=remaining)

    def left(self) -> tuple[int, ...]:
        """Steps per kind not yet delivered."""
        if self.delivered == 0:
            return self.counts
        done = Interleave(np.asarray(self.counts, dtype=np.int64)).prefix_counts(self.delivered)
        return tuple(int(c - d) for c, d in zip(self.counts, done))

    def kinds(self) -> np.ndarray:
        """(sum(counts) - delivered,) int64: the kind of each step left, in order."""
        total = sum(self.counts)
        if total == self.delivered:
            return np.zeros(0, dtype=np.int64)
        pos = np.arange(self.delivered, total, dtype=np.int64)
        return Interleave(np.asarray(self.counts, dtype=np.int64)).locate(pos)[0]

    def to_dict(self) -> dict:
        return {"counts": list(self.counts), "delivered": self.delivered}

    @classmethod
    def from_dict(cls, d: object) -> KindOrder:
        if not isinstance(d, Mapping) or set(d) != {"counts", "delivered"}:
            raise StateError(f"malformed kind order in a loader state: expected KindOrder.to_dict(), got {d!r}")
        counts, delivered = d["counts"], d["delivered"]
        if (not isinstance(counts, list) or not all(isinstance(c, int) and c >= 0 for c in counts)
                or not isinstance(delivered, int) or not 0 <= delivered <= sum(counts)):
            raise StateError(f"malformed kind order in a loader state: {d!r}")
        return cls(counts=tuple(counts), delivered=delivered)
