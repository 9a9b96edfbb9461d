"""`shardify which` for token runs: the documents and token ranges of every sequence of optimizer step N.

The token loader's state carries the run's history (loader/history.py) like the image loader's; the
token plan (plan/token_plan.py, plan/token_mix.py) replays a step's batches from it, and each sequence's
stream range maps back to global token ids, then to shards and documents through the offsets
sidecars of the shards it touches (aligned packing: every shard's, as the loader reads them).
Nothing is logged during training; no token is read here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataio.errors import ManifestError, StateError
from dataio.format.manifest import Manifest
from dataio.format.provenance import read_sources
from dataio.plan.mix import Mixture
from dataio.plan.schedule import Piece
from dataio.plan.token_mix import plan_token_mix_worker, token_mixture
from dataio.plan.token_plan import TokenPlanConfig, TokenWorkerPlan
from dataio.plan.types import PlanState, Progress, WorkerSlot
from dataio.plan.which import HistoryPass, StepPlace
from dataio.readers.token_shards import TokenShards
from dataio.storage.store import Store


@dataclass(frozen=True, kw_only=True)
class DocRange:
    """Tokens [start, end) of document `document` (its number within the shard) of one shard."""

    dataset: str  # the source's (redacted) URL
    shard: str  # the shard's path in the dataset
    document: int
    start: int
    end: int
    origin: str | None  # the provenance sidecar's source of the document (None: the dataset records none)


@dataclass(frozen=True, kw_only=True)
class StepSequence:
    """One sequence (row) of a step's batch on one rank: the token ranges its input_ids[:num_tokens] hold,
    in order; the rest of the row is padding."""

    rank: int
    micro: int  # which micro-batch of the step (grad_accum)
    row: int  # the sequence's row in its batch
    num_tokens: int  # tokens read: seq_len + 1 (its last is the next sequence's first) or fewer
    ranges: tuple[DocRange, ...]
    is_pad: bool  # a padding repeat (tail="pad"), not a real sequence of the step

    @property
    def key(self) -> str:
        """A readable name: 'SHARD#DOC[start:end]' per range, joined by '+' (spikes.jsonl's keys)."""
        return "+".join(f"{r.shard}#{r.document}[{r.start}:{r.end}]" for r in self.ranges)


def is_token_run(manifests: Sequence[Manifest]) -> bool:
    return any(m.tokens is not None for m in manifests)


def sequences_of_step(doc: dict[str, Any], chosen: HistoryPass, place: StepPlace, *, stores: list[Store],
                      manifests: list[Manifest], ranks: Sequence[int]) -> list[StepSequence]:
    """Every requested rank's sequences of the step at `place`, per the sidecar `doc`."""
    state = doc["loader"]
    if state.get("tokens") is None or not all(m.tokens is not None for m in manifests):
        raise StateError("the loader state and the datasets disagree on tokens (a token state for sample "
                         "datasets or the other way round): pass the run's own checkpoint")
    shape = json.loads(state["tokens"])
    config = TokenPlanConfig(seq_len=int(shape["seq_len"]), packing=str(shape["packing"]), plan=chosen.plan)
    shards = [TokenShards(st, m, verify_checksums=True) for st, m in zip(stores, manifests)]
    doc_lengths = tuple(s.plan_lengths(config.packing) for s in shards)
    mixture = _mixture(state, shards, doc_lengths, config, chosen.fingerprint)
    names = _Names(shards)
    out = []
    for r in ranks:
        for micro, batch in enumerate(place.batches):
            plan = _plan(doc_lengths, mixture, config, chosen.epoch, place, rank=r, batch=batch)
            for row, (source, gids, n, pad) in enumerate(_batch_rows(plan, config.plan.batch_size, batch)):
                out.append(StepSequence(rank=r, micro=micro, row=row, num_tokens=n, is_pad=pad,
                                        ranges=names.ranges(source, gids)))
    return out


def saved_mixture(state: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """The mixture a loader state describes (Mixture.describe()); a single dataset's state carries none, and
    describes the mixture of that one dataset, whose fingerprint the run's history names."""
    if "mixture" in state:
        return json.loads(state["mixture"])
    return {"sources": [{"fingerprint": fingerprint, "weight": None, "repeat": None}], "epoch_samples": None}


def _mixture(state: dict[str, Any], shards: list[TokenShards], doc_lengths: tuple, config: TokenPlanConfig,
             fingerprint: str) -> Mixture:
    """The token mixture the run read, rebuilt with its weights (a single dataset: a mixture of one)."""
    described = saved_mixture(state, fingerprint)
    sources = described["sources"]
    pieces = (described.get("schedule") or {}).get("pieces")
    for s, d in zip(shards, sources, strict=True):
        if s.manifest.fingerprint != d.get("fingerprint"):
            raise StateError(f"{s.store.url}: its fingerprint is {s.manifest.fingerprint}, the run read "
                             f"{d.get('fingerprint')}: the dataset was rewritten or appended since; its tokens "
                             "cannot be named")
    return token_mixture(doc_lengths, config, names=[s.store.url for s in shards],
                         weights=[1.0 if d.get("weight") is None else float(d["weight"]) for d in sources],
                         fingerprints=[s.manifest.fingerprint for s in shards],
                         schedule=[Piece(tuple(p["weights"]), p["samples"]) for p in pieces] if pieces else None)


def _plan(doc_lengths: tuple, mixture: Mixture, config: TokenPlanConfig, epoch: int, place: StepPlace, *,
          rank: int, batch: int) -> TokenWorkerPlan:
    """The plan of the worker that makes rank `rank`'s batch `batch`: worker 0 of a loader resumed just before it."""
    progress = place.before + (Progress(world_size=place.world_size, num_workers=place.num_workers, batches=batch),)
    state = PlanState(epoch=epoch, progress=progress)
    slot = WorkerSlot(rank=rank, world_size=place.world_size, worker_id=0, num_workers=place.num_workers)
    return plan_token_mix_worker(doc_lengths, mixture, config=config, slot=slot, state=state)


def _batch_rows(plan: TokenWorkerPlan, batch_size: int, batch: int
                ) -> Iterator[tuple[int, np.ndarray, int, bool]]:
    """(source, global token ids (n,), n, is_pad) of the plan's first batch_size sequences."""
    got = 0
    for window in plan.windows:  # the first window usually holds the whole batch
        for i in range(len(window.stream_starts)):
            group = window.groups[int(window.group[i])]
            n = int(window.num_tokens[i])
            yield group.source, group.order.token_ids(int(window.stream_starts[i]), n), n, bool(window.is_pad[i])
            got += 1
            if got == batch_size:
                return
    raise ValueError(f"batch {batch} is past the end of the epoch")


class _Names:
    """Global token ids of a source -> (shard, document, token range, provenance), reading each shard's
    offsets and provenance sidecar once."""

    def __init__(self, shards: list[TokenShards]) -> None:
        self.shards = shards
        self.starts = [np.concatenate([[0], np.cumsum(np.asarray(s.manifest.shard_num_tokens, dtype=np.int64))])
                       for s in shards]
        self.origins: dict[tuple[int, int], list[str] | None] = {}

    def ranges(self, source: int, gids: np.ndarray) -> tuple[DocRange, ...]:
        """The document ranges of ids `gids` (runs of consecutive ids, in order)."""
        breaks = np.flatnonzero(np.diff(gids) != 1) + 1
        out: list[DocRange] = []
        for a, b in zip(np.r_[0, breaks].tolist(), np.r_[breaks, len(gids)].tolist()):
            lo, hi = int(gids[a]), int(gids[b - 1]) + 1
            while lo < hi:  # a run may cross shards only where the manifest order continues
                shard = int(self.starts[source].searchsorted(lo, side="right")) - 1
                base = int(self.starts[source][shard])
                stop = min(hi, int(self.starts[source][shard + 1]))
                out += self._documents(source, shard, lo - base, stop - base)
                lo = stop
        return tuple(out)

    def _documents(self, source: int, shard: int, lo: int, hi: int) -> list[DocRange]:
        src = self.shards[source]
        offsets = src.offsets(shard)
        d0, d1 = int(offsets.searchsorted(lo, side="right")) - 1, int(offsets.searchsorted(hi, side="left"))
        origins = self._origins(source, shard)
        out = []
        for d in range(d0, d1):
            first, last = int(offsets[d]), int(offsets[d + 1])  # the document's tokens in the shard
            out.append(DocRange(dataset=src.store.url, shard=src.manifest.shard_paths[shard], document=d,
                                start=max(lo, first) - first, end=min(hi, last) - first,
                                origin=None if origins is None else origins[d]))
        return out

    def _origins(self, source: int, shard: int) -> list[str] | None:
        if (source, shard) not in self.origins:
            src = self.shards[source]
            try:
                self.origins[source, shard] = read_sources(src.store, src.manifest, shard)
            except ManifestError:
                self.origins[source, shard] = None  # written without provenance: none to name
        return self.origins[source, shard]
