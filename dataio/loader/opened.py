"""What an opened dataset (or mixture) gives the loader, whatever its kind: OpenedData.

One loader serves both kinds of data. A dataset of samples (tar or Parquet, images or not) opens
through mixing.py: its fields, its label space, a plan in samples. A token dataset (`seq_len`)
opens through token_data.py: one tokenizer, a plan in sequences cut by plan/token_plan.py. Both
end here, in one frozen object the loader keeps: the stores and manifests, the plan's Mixture and
PlanConfig, the TrainLoader facts, and what the plan of that kind needs to count steps and check a
saved state. Everything past this point (execution plan, tickets, streams, state) is one path.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dataio.errors import StateError, UnverifiedDataWarning
from dataio.format.manifest import Manifest
from dataio.loader.config import LoaderConfig, Source
from dataio.loader.facts import dataset_facts, where
from dataio.loader.labels import LabelSpace
from dataio.loader.mixing import MixedFields, OpenSources, batch_fields, label_space_of, mixed_window_samples, open_sources
from dataio.loader.protocol import DatasetFacts
from dataio.loader.startup import agree_on_dataset
from dataio.loader.token_data import open_tokens, token_facts
from dataio.plan.token_fit import token_shortfall
from dataio.plan.token_mix import token_mix_num_steps
from dataio.plan.token_plan import TokenPlanConfig
from dataio.plan.types import PlanConfig, PlanState, Topology
from dataio.storage.store import Store
from dataio.stream.job import TokenSpec

TOKENS_KEY = "tokens"  # a token loader's state: its seq_len and packing, as JSON text


@dataclass(frozen=True, kw_only=True)
class OpenedData:
    """The opened sources (one dataset: a mixture of one) and what their kind fixes for the plan."""

    sources: OpenSources  # stores, manifests (source order) and the plan's Mixture
    fingerprint: str  # the data's identity in a saved state
    plan_config: PlanConfig  # seed, batch_size (per rank), tail, shuffle and the window, in the plan's unit
    num_classes: int | None  # samples: the label space's classes; tokens: the vocabulary
    labels: LabelSpace | None = None  # samples only: labels checked and mapped per source
    fields: MixedFields | None = None  # samples only: what each source reads
    tokens: TokenSpec | None = None  # tokens only: the cut and what packing needs

    @functools.cached_property
    def facts(self) -> DatasetFacts:
        """What a trainer reads of the data (protocol.py): identity, size, mean stored sample, sources."""
        if self.tokens is not None:
            pairs = list(zip(self.sources.stores, self.sources.manifests))
            return token_facts(pairs, fingerprint=self.fingerprint, seq_len=self.tokens.seq_len,
                               mixture=self.sources.mixture)
        assert self.labels is not None
        return dataset_facts(self.sources, self.labels)

    @property
    def label_names(self) -> tuple[str, ...] | None:
        return None if self.labels is None else self.labels.names

    def steps_from(self, state: PlanState, world_size: int) -> int:
        """Batches every rank delivers from `state` to the epoch's end (a mixture's epoch, each schedule
        segment's, rounded down to the global batch; one dataset: not)."""
        if self.tokens is not None:
            config = TokenPlanConfig(seq_len=self.tokens.seq_len, packing=self.tokens.packing, plan=self.plan_config)
            return token_mix_num_steps(self.tokens.doc_lengths, self.sources.mixture, config=config,
                                       world_size=world_size, state=state)
        return int(self.sources.mixture.steps_from(config=self.plan_config, world_size=world_size, state=state))

    def state_extra(self) -> dict[str, Any]:
        """What a saved state carries besides the plan's position: a token loader's cut."""
        if self.tokens is None:
            return {}
        return {TOKENS_KEY: json.dumps({"seq_len": self.tokens.seq_len, "packing": self.tokens.packing})}

    def check_kind(self, state_dict: Any) -> None:
        """StateError unless the state was saved by a loader of this kind (and of a token loader, this cut)."""
        saved = state_dict.get(TOKENS_KEY) if isinstance(state_dict, dict) else None
        if self.tokens is None:
            if saved is not None:
                raise StateError(f"cannot resume: the state was saved by a token loader ({saved}), this one reads "
                                 "samples; build the loader with the same seq_len and packing")
            return
        mine = {"seq_len": self.tokens.seq_len, "packing": self.tokens.packing}
        if saved is None or json.loads(saved) != mine:
            raise StateError(f"cannot resume: the state was saved by a loader of {saved or 'samples, not tokens'}, "
                             f"this one reads {mine}; build the loader with the same seq_len and packing")

    def where(self, batch: dict[str, Any], i: int) -> str:
        """' in shard URL' (+ ' of source N (URL)' in a mixture) for sample i of a batch; token batches
        name no shard per sequence (a corrupt block is named when it is read)."""
        return "" if self.tokens is not None else where(self.sources, batch, i)


def open_data(sources: Sequence[Source], config: LoaderConfig) -> OpenedData:
    """Open the sources as what they are asked to be: token datasets with seq_len, else samples."""
    if config.seq_len is not None:
        opened, fingerprint, tokens, plan_config, vocab = open_tokens(sources, config)
        return OpenedData(sources=opened, fingerprint=fingerprint, plan_config=plan_config, num_classes=vocab,
                          tokens=tokens)
    opened = open_sources(sources, config)
    labels = label_space_of(sources, opened, config)  # labels checked, mapped per source
    plan_config = PlanConfig(seed=config.seed, batch_size=config.batch_size, tail=config.tail,
                             shuffle=config.shuffle, shuffle_window=mixed_window_samples(opened, config))
    return OpenedData(sources=opened, fingerprint=opened.fingerprint, plan_config=plan_config,
                      num_classes=labels.num_classes, labels=labels,
                      fields=batch_fields(opened, config))



def open_agreed(sources: Sequence[Source], config: LoaderConfig, *, topology: Topology, kv_store: Any) -> OpenedData:
    """open_data on this rank; with a `kv_store`, every rank checks that all opened the same data."""
    def opener() -> tuple[OpenedData, str]:
        data = open_data(sources, config)
        return data, data.fingerprint

    if kv_store is not None:
        data = agree_on_dataset(opener, rank=topology.rank, world_size=topology.world_size,
                                timeout_s=config.startup_timeout_s, kv_store=kv_store)
    else:
        data = open_data(sources, config)
    if config.verify_checksums and topology.rank == 0:
        note_unverified(data.sources.stores, data.sources.manifests)
    if data.tokens is not None:
        note_no_batch(data, config, world_size=topology.world_size)
    return data


def note_no_batch(data: OpenedData, config: LoaderConfig, *, world_size: int) -> None:
    """A token dataset too small for one global batch of sequences gives 0 batches: say so, naming seq_len."""
    manifests = data.sources.manifests
    short = token_shortfall(num_tokens=sum(sum(m.shard_num_tokens) for m in manifests), seq_len=config.seq_len,
                            batch_size=config.batch_size, world_size=world_size, tail=config.tail,
                            packing=config.packing)
    if short is not None and data.steps_from(PlanState(epoch=0), world_size) == 0:  # (a mixture may repeat)
        warnings.warn(f"{', '.join(st.url for st in data.sources.stores)}: {short}", UserWarning, stacklevel=5)


def note_unverified(stores: Sequence[Store], manifests: Sequence[Manifest]) -> None:
    """One UnverifiedDataWarning per dataset written before per-sample checksums (manifest version < 3)."""
    for store, manifest in zip(stores, manifests):
        if manifest.num_shards and not manifest.has_read_checksums:
            warnings.warn(UnverifiedDataWarning(
                f"{store.url}: written before per-sample checksums (manifest version {manifest.version}), so "
                "verify_checksums=True cannot check what is read from it: it loads unverified. Rewrite it with "
                "this shardify (`shardify write SRC DEST`) to have every read checked; `shardify verify "
                f"{store.url}` checks it whole meanwhile"), stacklevel=5)
