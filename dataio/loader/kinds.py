"""A loader over datasets of different kinds: image-label samples, image-text pairs and tokens, each
batch of one kind (plan/kinds.py says why and how the kinds' batches are ordered).

make_loader routes here when its sources are of more than one kind: token datasets (read with seq_len),
pair datasets (with context_length: captions tokenized) and the rest (samples). Every kind is a
ShardLoader of its own over its sources, its epoch its count of the epoch's samples; this loader takes
the next batch of the kind the order names, tags it with `kind` and the global `source` of each row,
and saves every kind's state plus the order's. Each kind has its own readers (num_workers each).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from dataio.errors import ManifestError, StateError
from dataio.format.captions import CAPTION_FIELD
from dataio.format.manifest import read_manifest
from dataio.loader.config import LoaderConfig, Source
from dataio.loader.protocol import DatasetFacts, SourceFacts
from dataio.loader.shard_loader import ShardLoader
from dataio.loader.state import mixture_fingerprint
from dataio.loader.stats import LoaderStats
from dataio.plan.kinds import KindOrder, kind_counts, kind_pieces
from dataio.plan.types import Topology
from dataio.storage.store import Store

KINDS_KEY = "kinds"  # the state: JSON text of every kind's state and the order
KINDS_VERSION = 1


def source_kinds(sources: Sequence[Source], config: LoaderConfig) -> list[str]:
    """Each source's kind from its manifest: "tokens" (token shards), "pairs" (captions, or a `txt`
    field, read with context_length), else "samples"."""
    kinds = []
    for s in sources:
        manifest = read_manifest(Store(s.url, config.storage).first_request())
        if manifest.format == "tokens":
            kinds.append("tokens")
        elif config.context_length is not None and (manifest.captions is not None or CAPTION_FIELD in manifest.field_names):
            kinds.append("pairs")
        else:
            kinds.append("samples")
    return kinds


def check_kinds(sources: Sequence[Source], kinds: Sequence[str], config: LoaderConfig) -> None:
    """ValueError, in one sentence naming two datasets, for a mixture across kinds asked of what it cannot do."""
    first = {k: s.url for s, k in zip(sources, kinds)}
    a, b = list(first.items())[:2]
    if config.mix_kinds == "in_batch":
        raise ValueError(f"cannot mix {a[1]} ({a[0]}) and {b[1]} ({b[0]}) in one batch, as mix_kinds='in_batch' "
                         "asks: their batches hold different fields; leave mix_kinds='by_batch' (each batch of one "
                         "kind, tagged batch['kind']) or load them apart")
    if "tokens" in first and config.seq_len is None:
        raise ValueError(f"cannot mix {first['tokens']} (tokens) with {a[1] if a[0] != 'tokens' else b[1]} without "
                         "seq_len: a token dataset's batches are packed sequences; pass seq_len=")
    repeated = next((s.url for s in sources if s.repeat is not None), None)
    if repeated is not None:
        raise ValueError(f"cannot mix {repeated} with repeat= across kinds ({a[1]} is {a[0]}, {b[1]} {b[0]}): "
                         "kinds share the epoch by weight; give each Source a weight")


class KindsLoader:
    """Batches of several kinds, one kind per batch, all ranks on the same kind at each step; Stateful."""

    def __init__(self, sources: Sequence[Source], kinds: Sequence[str], config: LoaderConfig, *,
                 topology: Topology, num_workers: int, kv_store: Any = None) -> None:
        check_kinds(sources, kinds, config)
        self.config, self.topology, self.sources = config, topology, tuple(sources)
        self.kinds = tuple(dict.fromkeys(kinds))
        self.groups = tuple(tuple(i for i, k in enumerate(kinds) if k == kind) for kind in self.kinds)
        weights = [1.0 if s.weight is None else float(s.weight) for s in sources]
        pieces = None
        if config.mix_schedule is not None:
            pieces = kind_pieces(config.mix_schedule, kinds, [s.url for s in sources])
            weights = list(config.mix_schedule[0].weights)

        def build(kind: int, epoch_samples: int | None) -> ShardLoader:
            group = [sources[i] for i in self.groups[kind]]
            own = _kind_config(config, self.kinds[kind], epoch_samples, pieces and pieces[self.kinds[kind]])
            return ShardLoader([Source(s.url, weight=weights[i]) for s, i in zip(group, self.groups[kind])], own,
                               topology=topology, num_workers=num_workers, kv_store=kv_store)

        # Each kind opened as it is, for its sizes (a token source's in sequences); rebuilt where its share
        # of the epoch differs from its own size.
        loaders = [build(k, None) for k in range(len(self.kinds))]
        sizes = [0] * len(sources)
        for loader, group in zip(loaders, self.groups):
            for i, src in zip(group, loader.mixture.sources):
                sizes[i] = src.num_samples
        self.counts = kind_counts(sizes, weights, kinds, config.epoch_samples)
        self.loaders = []
        for k, (kind, loader) in enumerate(zip(self.kinds, loaders)):
            if loader.mixture.total != self.counts[kind] or pieces is not None:
                loader.close()  # nothing started yet: it only opened the data
                loader = build(k, self.counts[kind])
            self.loaders.append(loader)
        self._order: KindOrder | None = None  # None: a new order at the next iteration
        self._epoch, self._finished, self._iterating = 0, False, False
        self.label_names = next((l.label_names for l in self.loaders if l.data.tokens is None), None)
        self.num_classes = next((l.num_classes for l in self.loaders if l.data.tokens is None), None)

    def start(self) -> KindsLoader:
        for loader in self.loaders:
            loader.start()
        return self

    def describe(self) -> str:
        """Every kind's execution plan, one line."""
        return "; ".join(f"{kind}: {loader.describe()}" for kind, loader in zip(self.kinds, self.loaders))

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def stats(self) -> LoaderStats:
        """What the kinds' loaders counted, summed."""
        out = LoaderStats(execution=self.describe())
        for loader in self.loaders:
            s = loader.stats
            out.add_skipped(s.corrupt_keys)
            out.corrupt_skipped += s.corrupt_skipped - len(s.corrupt_keys)
            out.add_hedges({"requests": s.ranged_reads, "hedged": s.hedged_reads, "won": s.hedges_won,
                            "over_budget": s.hedges_over_budget})
        return out

    @property
    def facts(self) -> DatasetFacts:
        """The kinds' sources, each with its share of the whole epoch."""
        total = max(1, sum(self.counts.values()))
        sources: list[SourceFacts | None] = [None] * len(self.sources)
        stored = 0.0
        for kind, loader, group in zip(self.kinds, self.loaders, self.groups):
            facts, share = loader.facts, self.counts[kind] / total
            stored += share * facts.bytes_per_sample
            for i, f in zip(group, facts.sources):
                sources[i] = SourceFacts(url=f.url, share=f.share * share, field_names=f.field_names,
                                         has_labels=f.has_labels)
        return DatasetFacts(identity=self.fingerprint, num_samples=total, bytes_per_sample=stored, mixed=True,
                            sources=tuple(s for s in sources if s is not None))

    @property
    def fingerprint(self) -> str:
        return mixture_fingerprint(self._describe())

    def _describe(self) -> dict:
        return {"kinds_version": KINDS_VERSION, "kinds": list(self.kinds), "counts": [self.counts[k] for k in self.kinds],
                "sources": [loader.fingerprint for loader in self.loaders]}

    def where(self, batch: dict[str, Any], i: int) -> str:
        """' in shard URL' (+ ' of source N (URL)' within its kind) for sample i of a batch."""
        k = self.kinds.index(batch["kind"])
        local = {key: value for key, value in batch.items() if key != "source"}
        if len(self.groups[k]) > 1:
            index = {g: j for j, g in enumerate(self.groups[k])}
            local["source"] = torch.as_tensor([index[int(s)] for s in batch["source"].tolist()])
        return self.loaders[k].where(local, i)

    def shares_at(self, samples_seen: int) -> list[float] | None:
        return None

    def sources_added_since(self, state_dict: dict[str, Any]) -> int:
        return 0

    # --- epochs and iteration ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration delivers; a resumed epoch keeps its position."""
        if epoch != self._epoch or self._finished:
            self._order, self._finished = None, False
        self._epoch = epoch
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def __len__(self) -> int:
        return sum(len(loader) for loader in self.loaders)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._finished:  # iterating again repeats the finished epoch, as a ShardLoader does
            self._order, self._finished = None, False
        order = KindOrder.fitted(self._order, [len(loader) for loader in self.loaders])
        self._order = order
        return self._deliver(order)

    def _deliver(self, order: KindOrder) -> Iterator[dict[str, Any]]:
        iterators: list[Iterator[dict[str, Any]] | None] = [None] * len(self.loaders)
        try:
            for n, k in enumerate(order.kinds().tolist(), 1):
                if iterators[k] is None:
                    iterators[k] = iter(self.loaders[k])
                batch = next(iterators[k])  # type: ignore[arg-type]
                self._order = KindOrder(counts=order.counts, delivered=order.delivered + n)
                yield self._tagged(batch, k)
            for it in iterators:  # each kind's iteration runs to its end: its loader marks the epoch done
                if it is not None:
                    for _ in it:
                        raise RuntimeError("a kind's loader delivered more batches than it counted")
            self._finished = True
        finally:
            for it in iterators:
                if it is not None and hasattr(it, "close"):
                    it.close()

    def _tagged(self, batch: Any, k: int) -> Any:
        """The batch with its kind and every row's global source index (the sources as given)."""
        if not isinstance(batch, dict):
            return batch
        group = self.groups[k]
        if "source" in batch and len(group) > 1:
            batch["source"] = torch.as_tensor(group, dtype=torch.int64)[batch["source"]]
        else:
            batch["source"] = torch.full((self.config.batch_size,), group[0], dtype=torch.int64)
        batch["kind"] = self.kinds[k]
        return batch

    # --- Stateful ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every kind's state and the order's, as JSON text (any rank's loads into any topology)."""
        order = None if self._order is None or self._finished else self._order.to_dict()
        text = json.dumps({"describe": self._describe(), "order": order, "epoch": self._epoch,
                           "finished": self._finished,
                           "states": [loader.state_dict() for loader in self.loaders]}, sort_keys=True)
        return {KINDS_KEY: text, "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume every kind where it was, and the order where it fits (StateError says what does not)."""
        text = state_dict.get(KINDS_KEY) if isinstance(state_dict, dict) else None
        if not isinstance(text, str):
            raise StateError(f"cannot resume: this loader mixes kinds {list(self.kinds)}, the state was not saved by "
                             "one (it has no 'kinds' key); build the loader with the sources that saved it")
        saved = json.loads(text)
        if saved.get("describe") != self._describe():
            raise StateError(f"cannot resume: the state was saved by a mixture across kinds {saved.get('describe')}, "
                             f"this one is {self._describe()}; use the same sources, weights and epoch_samples")
        for loader, state in zip(self.loaders, saved["states"]):
            loader.load_state_dict(state)
        self._order = None if saved["order"] is None else KindOrder.from_dict(saved["order"])
        self._epoch, self._finished = int(saved["epoch"]), bool(saved["finished"])

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()

    def __enter__(self) -> KindsLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kind_config(config: LoaderConfig, kind: str, epoch_samples: int | None, pieces: Any) -> LoaderConfig:
    """The options a kind's loader takes: seq_len for tokens, context_length for pairs, neither for samples;
    its epoch its share; a schedule its pieces."""
    flat = {o.name: getattr(config, o.name) for o in LoaderConfig.options()}
    flat.update(epoch_samples=epoch_samples, mix_schedule=pieces or None, mix_kinds="by_batch")
    if kind != "tokens":
        flat["seq_len"] = None
    if kind != "pairs":
        flat["context_length"] = None
    if kind == "samples":
        flat["tokenizer"] = None
    return LoaderConfig.from_options(**flat)
