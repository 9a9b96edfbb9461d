"""Opening token datasets for the token loader (tokens.py): manifests checked, one tokenizer for all
sources and the one the caller names (by its file's hash), the job's fingerprint, the TrainLoader facts."""

from __future__ import annotations

import json
from collections.abc import Sequence

import xxhash

from dataio.errors import ManifestError
from dataio.format.manifest import Manifest, read_manifest
from dataio.loader.config import LoaderConfig, Source
from dataio.loader.protocol import DatasetFacts, SourceFacts
from dataio.plan.mix import Mixture
from dataio.storage.store import Store

TOKEN_FIELDS = ("input_ids", "position_ids", "doc_ids", "loss_mask", "mask")


def tokenizer_hash(path: str) -> str:
    """"xxh3_64:<hex>" of a tokenizer file, as the manifest records it (sharding/tokenizer.py)."""
    try:
        with open(path, "rb") as f:
            return "xxh3_64:" + xxhash.xxh3_64_hexdigest(f.read())
    except OSError as exc:
        raise ValueError(f"tokenizer {path}: cannot read it ({exc.strerror or exc})") from None


def check_tokenizer(manifest: Manifest, url: str, path: str) -> None:
    """ValueError unless the tokenizer file at `path` is the one the dataset at `url` was written with."""
    assert manifest.tokens is not None
    want, got = manifest.tokens.tokenizer, tokenizer_hash(path)
    if got != want.file_hash:
        raise ValueError(f"{url}: tokenized by {want.name!r} ({want.file_hash}), but tokenizer={path} hashes to "
                         f"{got}: its ids would not match the dataset's; pass the dataset's tokenizer, or rewrite the "
                         "dataset with this one")


def open_token_dataset(url: str, config: LoaderConfig) -> tuple[Store, Manifest]:
    """The Store and manifest of a token dataset, its tokenizer checked; ManifestError for another format."""
    store = Store(url, config.storage)
    manifest = read_manifest(store.first_request())  # a stuck endpoint fails within 30 s
    if manifest.format != "tokens" or manifest.tokens is None:
        raise ManifestError(f"{store.url}: seq_len= reads token datasets (`shardify write TEXT DEST --tokenizer "
                            f"FILE`); this one holds {manifest.format} shards: leave seq_len out")
    if config.tokenizer is not None:
        check_tokenizer(manifest, store.url, config.tokenizer)
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
