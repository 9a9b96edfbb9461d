"""Opening token datasets (`make_loader(url, seq_len=L)`): manifests checked, one tokenizer for all
sources and the one the caller names (by its file's hash), the job's fingerprint, what the token plan
cuts (plan/token_plan.py: every shard's tokens, or every document's length for aligned packing), its
window, the token Mixture and the TrainLoader facts. The rest of the loader is the one every dataset
takes (loader/opened.py): tickets, the token stream kind (stream/token_stream.py), state and resume.

The plan's unit is the sequence: shards permuted by (seed, epoch), their documents concatenated in
stored order, cut into sequences of L + 1 tokens ("concat") or from each document start ("aligned",
padded and masked), shuffled within windows; every rank gets equal steps, every token is in exactly
one sequence but a tail under one global batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import xxhash

from dataio.errors import ManifestError
from dataio.format.manifest import Manifest, read_manifest
from dataio.loader.config import LoaderConfig, Source
from dataio.loader.mixing import OpenSources
from dataio.loader.protocol import DatasetFacts, SourceFacts
from dataio.plan.mix import Mixture
from dataio.plan.token_mix import token_mixture
from dataio.plan.token_plan import SequenceOrder, TokenPlanConfig
from dataio.plan.types import PlanConfig
from dataio.readers.token_shards import TokenShards
from dataio.storage.store import Store
from dataio.stream.job import TokenSpec

TOKEN_FIELDS = ("input_ids", "position_ids", "doc_ids", "loss_mask", "mask")


def open_token_dataset(url: str, config: LoaderConfig) -> tuple[Store, Manifest]:
    """The Store and manifest of a token dataset, its tokenizer checked; ManifestError for another format."""
    store = Store(url, config.storage)
    manifest = read_manifest(store.first_request())  # a stuck endpoint fails within 30 s
    if manifest.format != "tokens" or manifest.tokens is None:
        raise ManifestError(f"{store.url}: seq_len= reads token datasets (`shardify write TEXT DEST --tokenizer "
                            f"FILE`); this one holds {manifest.format} shards: leave seq_len out")
    if config.tokenizer is not None:
        manifest.tokens.tokenizer.check_file(config.tokenizer, url=store.url)
    return store, manifest


def open_token_sources(sources: Sequence[Source], config: LoaderConfig) -> tuple[list[tuple[Store, Manifest]], str]:
    """Every source opened and checked (one tokenizer for all), and the job's fingerprint."""
    opened = [open_token_dataset(s.url, config) for s in sources]
    hashes = {m.tokens.tokenizer.file_hash for _, m in opened if m.tokens is not None}
    if len(hashes) > 1:
        raise ValueError(f"token sources {[st.url for st, _ in opened]} were tokenized by different tokenizers "
                         f"({sorted(hashes)}): their ids mean different things; mix datasets of one tokenizer")
    if len(opened) == 1:
        return opened, opened[0][1].fingerprint
    text = json.dumps([[m.fingerprint, s.weight] for s, (_, m) in zip(sources, opened)])
    return opened, "tokmix-" + xxhash.xxh3_128_hexdigest(text.encode())


def token_facts(opened: Sequence[tuple[Store, Manifest]], *, fingerprint: str, seq_len: int,
                mixture: Mixture) -> DatasetFacts:
    """The TrainLoader facts of a token job: a sample is a sequence of seq_len input tokens."""
    shares = [int(c) / max(1, mixture.total) for c in mixture.counts]
    itemsize = max(m.tokens.np_dtype.itemsize for _, m in opened if m.tokens is not None)
    return DatasetFacts(
        identity=fingerprint, num_samples=int(mixture.total), bytes_per_sample=float(seq_len * itemsize),
        mixed=not mixture.single,
        sources=tuple(SourceFacts(url=store.url, share=share, field_names=TOKEN_FIELDS, has_labels=False)
                      for (store, _), share in zip(opened, shares)))


def open_tokens(sources: Sequence[Source], config: LoaderConfig) -> tuple[OpenSources, str, TokenSpec, PlanConfig, int]:
    """(the opened sources with their token Mixture, the fingerprint, what packing needs, the plan's
    settings in sequences, the vocabulary size) of token datasets read as config asks."""
    if any(s.repeat is not None for s in sources):
        raise ValueError("token mixtures take weights (token shares), not repeat=; give each Source a weight")
    assert config.seq_len is not None
    opened, fingerprint = open_token_sources(sources, config)
    info = opened[0][1].tokens
    assert info is not None
    seq_bytes = (config.seq_len + 1) * info.np_dtype.itemsize
    window = config.shuffle_window if config.shuffle_window_bytes is None else max(
        1, min(config.shuffle_window, config.shuffle_window_bytes // seq_bytes))
    plan_config = PlanConfig(seed=config.seed, batch_size=config.batch_size, tail=config.tail,
                             shuffle=config.shuffle, shuffle_window=window)
    plan = TokenPlanConfig(seq_len=config.seq_len, packing=config.packing, plan=plan_config)
    doc_lengths = tuple(TokenShards(st, m, verify_checksums=config.verify_checksums).plan_lengths(config.packing)
                        for st, m in opened)
    for (store, _), docs in zip(opened, doc_lengths):
        try:
            SequenceOrder(docs, plan, 0)  # aligned packing refuses a seq_len above every document
        except ValueError as exc:
            raise ValueError(f"{store.url}: {exc}") from None
    # One dataset is a mixture of one (Mixture.single): plan/token_mix.py plans it as plan/token_plan.py
    # does, and its state has no 'mixture' key (state.py).
    mixture = token_mixture(doc_lengths, plan, names=[st.url for st, _ in opened],
                            weights=[1.0 if s.weight is None else s.weight for s in sources],
                            fingerprints=[m.fingerprint for _, m in opened],
                            schedule=config.mix_schedule,  # pieces last a number of sequences
                            epoch_samples=config.epoch_samples)
    spec = TokenSpec(seq_len=config.seq_len, packing=config.packing, doc_lengths=doc_lengths,
                     with_docs=config.fields is None or "doc_ids" in config.fields, pad_id=info.tokenizer.eos_id)
    sources_ = OpenSources(stores=tuple(st for st, _ in opened), manifests=tuple(m for _, m in opened),
                           mixture=mixture)
    return sources_, fingerprint, spec, plan_config, info.tokenizer.vocab_size

