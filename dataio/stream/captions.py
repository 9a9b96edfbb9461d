"""The caption stage of image-text pairs: in the worker that makes a batch, one caption per sample
is picked and tokenized into `input_ids` [B, context_length] and `attention_mask` [B, context_length].

Which caption: a sample's `json["captions"]` list when it has one (else its caption field alone),
indexed by a hash of (seed, epoch, sample id) (dataio.rand), so the choice depends on nothing a
resume or another world size changes. Each caption is tokenized without special tokens, cut to
context_length - 1 ids, ended by the tokenizer's end token (kept even when cut), then padded with
`pad_id`; the mask is 1 on the ids and the end token, 0 on padding.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dataio.errors import CorruptSampleError
from dataio.format.captions import CAPTION_FIELD, CAPTION_LIST_KEY
from dataio.format.manifest import Manifest
from dataio.format.token_layout import tokenizer_file_hash
from dataio.rand import key, sample_seed
from dataio.storage.store import Store

# Tried in order: the names common tokenizers give their end-of-text token.
END_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|im_end|>")
_CAPTION_STREAM = 0xCA9  # keeps the caption draw apart from the crop's draw of the same sample seed


@dataclass(frozen=True, slots=True)
class CaptionTokenizer:
    """A Hugging Face tokenizer.json or a NAME.tiktoken file, loaded once per process."""

    impl: Any
    kind: str  # "hf" or "tiktoken"
    end_id: int

    @property
    def vocab_size(self) -> int:
        if self.kind == "hf":
            return int(self.impl.get_vocab_size(with_added_tokens=True))
        return int(self.impl.n_vocab)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self.kind == "hf":
            encode = getattr(self.impl, "encode_batch_fast", self.impl.encode_batch)
            return [e.ids for e in encode(list(texts), add_special_tokens=False)]
        return self.impl.encode_ordinary_batch(list(texts))


_LOADED: dict[tuple[str, float], CaptionTokenizer] = {}


def load_caption_tokenizer(path: str) -> CaptionTokenizer:
    """The tokenizer at `path` (cached per process); ValueError naming the file and the fix."""
    try:
        cache_key = (os.path.abspath(path), os.path.getmtime(path))
    except OSError as exc:
        raise ValueError(f"tokenizer {path}: cannot read it ({exc.strerror or exc}); give a tokenizer.json "
                         "(Hugging Face tokenizers) or a NAME.tiktoken file") from None
    if cache_key not in _LOADED:
        _LOADED[cache_key] = _load_tiktoken(path) if path.endswith(".tiktoken") else _load_hf(path)
    return _LOADED[cache_key]


def _load_hf(path: str) -> CaptionTokenizer:
    from tokenizers import Tokenizer

    try:
        impl = Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
        raise ValueError(f"tokenizer {path}: not a Hugging Face tokenizer.json ({exc})") from None
    for name in END_TOKENS:
        end = impl.token_to_id(name)
        if end is not None:
            return CaptionTokenizer(impl, "hf", int(end))
    raise ValueError(f"tokenizer {path}: no end-of-text token (tried {list(END_TOKENS)}); add one to it")


def _load_tiktoken(path: str) -> CaptionTokenizer:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(path)
    end_name = END_TOKENS[0]
    special = {end_name: len(ranks)} if end_name.encode() not in ranks else {}
    impl = tiktoken.Encoding(os.path.basename(path), mergeable_ranks=ranks, special_tokens=special,
                             pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    return CaptionTokenizer(impl, "tiktoken", special.get(end_name, ranks.get(end_name.encode(), 0)))


@dataclass(frozen=True, kw_only=True)
class CaptionStage:
    """Picklable: what a worker needs to tokenize a batch's captions (the tokenizer opens lazily)."""

    tokenizer: str
    context_length: int
    seed: int
    field: str = CAPTION_FIELD
    list_key: str = CAPTION_LIST_KEY
    pad_id: int = 0

    def captions(self, sample: dict[str, Any]) -> list[str]:
        """The sample's captions: its json list when it has one, else its caption field."""
        meta = sample.get("json")
        if isinstance(meta, (bytes, bytearray, memoryview)):
            try:
                meta = json.loads(bytes(meta))
            except (json.JSONDecodeError, UnicodeDecodeError):
                meta = None
        listed = meta.get(self.list_key) if isinstance(meta, dict) else None
        if isinstance(listed, list) and listed and all(isinstance(c, str) for c in listed):
            return listed
        value = sample.get(self.field)
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode("utf-8", "replace")
        if not isinstance(value, str):
            url, name = str(sample.get("__url__", "?")), str(sample.get("__key__", "?"))
            raise CorruptSampleError(
                f"{url}: sample {name!r} has no caption (field {self.field!r}; it has "
                f"{[k for k in sample if not k.startswith('__')]}); write the dataset with `shardify write "
                "--captions`, or give a pair dataset", url=url, key=name)
        return [value]

    def pick(self, captions: Sequence[str], *, epoch: int, sample_id: int) -> str:
        """One caption of a sample for this epoch: a function of (seed, epoch, sample id) only."""
        if len(captions) == 1:
            return captions[0]
        return captions[key(sample_seed(self.seed, epoch, sample_id), _CAPTION_STREAM) % len(captions)]

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask, int64 [len(texts), context_length]."""
        tok = load_caption_tokenizer(self.tokenizer)
        n, length = len(texts), self.context_length
        ids = torch.full((n, length), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((n, length), dtype=torch.int64)
        for row, encoded in enumerate(tok.encode_batch(texts)):
            kept = [*encoded[: length - 1], tok.end_id]  # cut, the end token kept
            ids[row, : len(kept)] = torch.tensor(kept, dtype=torch.int64)
            mask[row, : len(kept)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def __call__(self, samples: Sequence[dict[str, Any]], *, epoch: int) -> dict[str, torch.Tensor]:
        texts = [self.pick(self.captions(s), epoch=epoch, sample_id=int(s["__id__"])) for s in samples]
        return self.tokenize(texts)

    def of_batch(self, batch: dict[str, Any], ids: Sequence[int], *, epoch: int, urls: Sequence[str] = ()) -> dict[str, torch.Tensor]:
        """The same for a RAW batch (decode=None, and the GPU's undecoded batches): each row's caption
        field (PackedBytes) and json (parsed), row i being sample ids[i]."""
        texts, metas = batch.get(self.field), batch.get("json")
        samples = [{"__id__": int(sample_id), "__key__": batch["__key__"][i],
                    "__url__": urls[i] if i < len(urls) else "?",
                    self.field: None if texts is None else texts[i],
                    "json": None if metas is None else metas[i]}
                   for i, sample_id in enumerate(ids)]
        return self(samples, epoch=epoch)


def caption_stage(manifests: Sequence[Manifest], *, tokenizer: str | None, context_length: int | None,
                  seed: int, urls: Sequence[str] = (), stores: Sequence[Store] = ()) -> CaptionStage | None:
    """The stage for make_loader(..., tokenizer=, context_length=), or None without context_length;
    the caption field from the first pair dataset's manifest (`txt`, img2dataset's, otherwise), the
    tokenizer the one given or else the one the manifests name (tokenizer_for). ValueError for a
    source that has no captions (one kind per batch)."""
    if context_length is None:
        return None
    urls = list(urls) or [f"source {i}" for i in range(len(manifests))]
    for url, m in zip(urls, manifests):
        if m.captions is None and CAPTION_FIELD not in m.field_names:
            raise ValueError(f"{url} holds no captions (fields {list(m.field_names)}), and image-label, image-text "
                             "and token datasets cannot share a batch: load it with a loader of its own, without "
                             "context_length")
    tokenizer = tokenizer_for(manifests, stores, urls, given=tokenizer)
    load_caption_tokenizer(tokenizer)  # a bad file fails here, once, not in every worker
    info = next((m.captions for m in manifests if m.captions is not None), None)
    if info is None:
        return CaptionStage(tokenizer=tokenizer, context_length=context_length, seed=seed)
    return CaptionStage(tokenizer=tokenizer, context_length=context_length, seed=seed, field=info.field,
                        list_key=info.list_key)


def tokenizer_for(manifests: Sequence[Manifest], stores: Sequence[Store], urls: Sequence[str], *,
                  given: str | None) -> str:
    """A local path of the captions' tokenizer: `given`, refused unless it is the one every manifest that
    names a tokenizer names (by hash); else the named one (a local dataset's own file, or a remote one's
    copied once into a cache folder beside the temporary files)."""
    named = [(url, store, m.captions) for url, store, m in zip(urls, list(stores) or [None] * len(urls), manifests)
             if m.captions is not None and m.captions.tokenizer]
    if given is not None:
        got = tokenizer_file_hash(given)
        for url, _, info in named:
            if info.tokenizer_hash != got:
                raise ValueError(f"{url}: its captions were written for the tokenizer {info.tokenizer} "
                                 f"({info.tokenizer_hash}), but tokenizer={given} hashes to {got}: pass the "
                                 "dataset's tokenizer (or leave tokenizer= out to use it), or rewrite the dataset")
        return given
    if not named:
        raise ValueError(f"context_length tokenizes captions, and {urls[0]} names no tokenizer: give tokenizer= (a "
                         "tokenizer.json or .tiktoken file), or write the dataset with --captions --tokenizer FILE")
    hashes = {info.tokenizer_hash for _, _, info in named}
    if len(hashes) > 1:
        raise ValueError(f"{named[0][0]} and {[u for u, _, i in named if i.tokenizer_hash != named[0][2].tokenizer_hash][0]} "
                         "name different caption tokenizers: give one with tokenizer=, or mix datasets of one tokenizer")
    url, store, info = named[0]
    assert store is not None, "tokenizer_for needs the stores to fetch a named tokenizer"
    return _local_copy(store, info.tokenizer, info.tokenizer_hash, url)


def _local_copy(store: Store, rel: str, want: str, url: str) -> str:
    """The tokenizer file at `rel` of the dataset as a local path, its hash checked."""
    if store.is_local:
        path = store.path(rel)
    else:
        folder = os.path.join(tempfile.gettempdir(), "shardify-tokenizers", want.split(":")[-1])
        path = os.path.join(folder, os.path.basename(rel))
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            partial = f"{path}.{os.getpid()}.part"
            with open(partial, "wb") as f:
                f.write(store.read(rel))
            os.replace(partial, path)  # other processes see the whole file or none
    got = tokenizer_file_hash(path)
    if got != want:
        raise ValueError(f"{url}: its tokenizer {store.url_of(rel)} hashes to {got}, the manifest records {want}: "
                         "the file was changed after the write; rewrite the dataset, or give tokenizer=")
    return path
