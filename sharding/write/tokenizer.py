"""Tokenizers for `shardify write` of text: a Hugging Face tokenizer.json (the default) or a local
tiktoken ranks file, each resolved to its EOS id and described for the manifest (TokenizerInfo).

`train_bpe` makes a byte-level BPE tokenizer.json from a corpus, so everything works offline.
A tokenizer is loaded once per process (`load_tokenizer` caches by path): workers load their own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataio.format.token_layout import TokenizerInfo, dtype_for, tokenizer_file_hash
from sharding.sources.base import SourceError

# Tried in order when no --eos-token is given: the names common tokenizers give their end marker.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|im_end|>")
DEFAULT_EOS = "<|endoftext|>"  # the one `train_bpe` adds, and a tiktoken file's when it has none
TIKTOKEN_SUFFIX = ".tiktoken"
# GPT-2's split pattern (tiktoken's r50k): the default for a tiktoken file of no known name.
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
                  r"""\s*[\r\n]|\s+(?!\S)|\s+""")


# A document longer than LONG_DOCUMENT_CHARS is encoded in pieces of about PIECE_CHARS, PIECES_PER_CALL
# at a time: tokenizers hold ~200 bytes per character while encoding (a 50 MB document took 11 GB whole).
LONG_DOCUMENT_CHARS = 1 << 20
PIECE_CHARS = 1 << 18
PIECES_PER_CALL = 4


@dataclass(frozen=True, slots=True)
class Tokenizer:
    """A loaded tokenizer: batch encoding to ids (no EOS added), decoding, and its manifest record."""

    impl: Any
    info: TokenizerInfo

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids (uint32). A text over LONG_DOCUMENT_CHARS is encoded in pieces cut by `cut_points`,
        in bounded memory; for byte-level BPE (GPT-2 / cl100k split patterns) the ids are the whole text's."""
        out: list[np.ndarray | None] = [None] * len(texts)
        short = [i for i, t in enumerate(texts) if len(t) <= LONG_DOCUMENT_CHARS]
        for i, ids in zip(short, self._encode([texts[i] for i in short])):
            out[i] = np.asarray(ids, dtype=np.uint32)
        for i, text in enumerate(texts):
            if out[i] is None:
                out[i] = self._encode_long(text)
        return out  # type: ignore[return-value]

    def _encode(self, texts: list[str]) -> list[list[int]]:
        if self.info.kind == "hf":
            # encode_batch_fast (tokenizers >= 0.21) skips the offsets we do not keep: about 2x faster here
            encode = getattr(self.impl, "encode_batch_fast", self.impl.encode_batch)
            return [e.ids for e in encode(texts, add_special_tokens=False)]
        return self.impl.encode_ordinary_batch(texts)

    def _encode_long(self, text: str) -> np.ndarray:
        cuts = [0, *cut_points(text, PIECE_CHARS), len(text)]
        spans = list(zip(cuts[:-1], cuts[1:]))
        parts = []
        for k in range(0, len(spans), PIECES_PER_CALL):
            encoded = self._encode([text[a:b] for a, b in spans[k:k + PIECES_PER_CALL]])
            parts += [np.asarray(ids, dtype=np.uint32) for ids in encoded]
        return np.concatenate(parts)

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if self.info.kind == "hf":
            return self.impl.decode(ids, skip_special_tokens=False)
        return self.impl.decode(ids)

    @property
    def dtype(self) -> str:
        return dtype_for(self.info.vocab_size, where=self.info.name)


_LOADED: dict[tuple[str, str | None, float], Tokenizer] = {}


def load_tokenizer(path: str, *, eos_token: str | None = None) -> Tokenizer:
    """A tokenizer.json (Hugging Face tokenizers) or NAME.tiktoken file; SourceError naming the file and
    what to do when it is missing, unreadable, or has no EOS token (pass --eos-token)."""
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such tokenizer file; give a tokenizer.json (or a .tiktoken file), or make "
                          "one from your corpus with `shardify tokenizer train SRC --vocab-size N -o tokenizer.json`")
    cache_key = (os.path.abspath(path), eos_token, os.path.getmtime(path))
    if cache_key not in _LOADED:
        load = _load_tiktoken if path.endswith(TIKTOKEN_SUFFIX) else _load_hf
        _LOADED[cache_key] = load(path, eos_token)
    return _LOADED[cache_key]


def _require(module: str) -> Any:
    """Import an optional tokenizer library, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise SourceError(f"text needs the {module.split('.')[0]!r} package: pip install 'shardify[text]'") from None


def _load_hf(path: str, eos_token: str | None) -> Tokenizer:
    HFTokenizer = _require("tokenizers").Tokenizer  # noqa: N806 - the library's class

    try:
        impl = HFTokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
        raise SourceError(f"{path}: not a Hugging Face tokenizer.json ({exc}); give the tokenizer.json of a "
                          "`tokenizers` tokenizer, or a .tiktoken file") from None
    special = {t.content: i for i, t in impl.get_added_tokens_decoder().items() if t.special}
    eos = _resolve_eos(path, eos_token, special, impl.token_to_id)
    vocab_size = impl.get_vocab_size(with_added_tokens=True)
    _check_ids(path, vocab_size, impl.get_vocab(with_added_tokens=True))
    info = TokenizerInfo(name=os.path.basename(path), kind="hf", vocab_size=vocab_size,
                         eos_id=eos, special_ids=special, file_hash=tokenizer_file_hash(path))
    _check_fits(info, path)
    return Tokenizer(impl, info)


def _load_tiktoken(path: str, eos_token: str | None) -> Tokenizer:
    tiktoken = _require("tiktoken")
    load_tiktoken_bpe = _require("tiktoken.load").load_tiktoken_bpe

    try:
        ranks = load_tiktoken_bpe(path)
    except Exception as exc:  # noqa: BLE001 - base64 / format errors of a damaged file
        raise SourceError(f"{path}: not a tiktoken ranks file ({type(exc).__name__}: {exc}); give a "
                          "NAME.tiktoken file (base64 token and rank per line)") from None
    name = os.path.basename(path)[: -len(TIKTOKEN_SUFFIX)]
    eos_name = eos_token or DEFAULT_EOS
    special = {eos_name: len(ranks)} if eos_name.encode() not in ranks else {}
    pattern = CL100K_PATTERN if name in ("cl100k_base", "o200k_base") else R50K_PATTERN
    impl = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)
    eos = special[eos_name] if special else ranks[eos_name.encode()]
    info = TokenizerInfo(name=os.path.basename(path), kind="tiktoken", vocab_size=impl.n_vocab, eos_id=eos,
                         special_ids=special, file_hash=tokenizer_file_hash(path))
    _check_fits(info, path)
    return Tokenizer(impl, info)


def _resolve_eos(path: str, eos_token: str | None, special: dict[str, int], token_to_id: Any) -> int:
    """The EOS id: --eos-token if given (it must exist), else the first of EOS_CANDIDATES present."""
    if eos_token is not None:
        eos = token_to_id(eos_token)
        if eos is None:
            raise SourceError(f"{path}: --eos-token {eos_token!r} is not in the tokenizer's vocabulary; its special "
                              f"tokens are {sorted(special)}")
        return int(eos)
    for name in EOS_CANDIDATES:
        eos = token_to_id(name)
        if eos is not None:
            return int(eos)
    raise SourceError(f"{path}: no end-of-document token found (tried {list(EOS_CANDIDATES)}; its special tokens "
                      f"are {sorted(special)}); name one with --eos-token")


def _check_ids(path: str, vocab_size: int, vocab: dict[str, int]) -> None:
    """SourceError naming the file and the ids when an id is not below the vocabulary size: shards size
    their dtype, and models their embedding, by that size."""
    past = sorted((i, t) for t, i in vocab.items() if not 0 <= i < vocab_size)
    if past:
        shown = ", ".join(f"{t!r}={i}" for i, t in past[:5]) + (f" and {len(past) - 5} more" if len(past) > 5 else "")
        raise SourceError(f"{path}: {len(past)} token id(s) lie outside its vocabulary of {vocab_size} ids "
                          f"(0..{vocab_size - 1}): {shown}; number the tokenizer's vocabulary 0..N-1 (or retrain it "
                          "with `shardify tokenizer train`)")


def _check_fits(info: TokenizerInfo, path: str) -> None:
    try:
        dtype_for(info.vocab_size, where=path)
    except ValueError as exc:
        raise SourceError(str(exc)) from None


def train_bpe(texts: Iterable[str], vocab_size: int, out_path: str, *, eos_token: str = DEFAULT_EOS) -> TokenizerInfo:
    """Train a byte-level BPE tokenizer (GPT-2 style, lossless on any text) and save its tokenizer.json."""
    lib = _require("tokenizers")
    HFTokenizer, decoders, models, pre_tokenizers, trainers = (  # noqa: N806 - the library's names
        lib.Tokenizer, lib.decoders, lib.models, lib.pre_tokenizers, lib.trainers)

    if vocab_size < 257:
        raise ValueError(f"vocab size {vocab_size}: a byte-level BPE needs at least 257 ids (256 bytes and EOS)")
    folder = os.path.dirname(out_path) or "."
    if not os.path.isdir(folder):  # before training, not after (the library's error names no path)
        raise SourceError(f"-o {out_path}: the folder {folder} does not exist; create it first (mkdir -p {folder}), "
                          "or write the tokenizer elsewhere")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos_token], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tmp = f"{out_path}.tmp-{os.getpid()}"
    try:
        tok.save(tmp)
        os.replace(tmp, out_path)
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception ("os error 13")
        raise SourceError(f"-o {out_path}: cannot write the tokenizer there ({exc})") from None
    return load_tokenizer(out_path, eos_token=eos_token).info


def cut_points(text: str, size: int) -> list[int]:
    """Where to cut `text` into pieces of at most `size` characters: before a space that follows a non-space.
    No pre-token of a byte-level BPE (GPT-2's or cl100k's split pattern) holds a non-space and then a space,
    so each piece pre-tokenizes, and encodes, as that stretch of the whole text does. A stretch of `size`
    with no such space (one long word, or only whitespace) is cut at `size`: there alone the ids may
    differ from the whole text's (a pre-token split in two)."""
    cuts, start = [], 0
    while len(text) - start > size:
        end = start + size
        p = text.rfind(" ", start + 1, end)
        while p > start and text[p - 1].isspace():
            p = text.rfind(" ", start + 1, p)
        start = p if p > start else end
        cuts.append(start)
    return cuts


def bytes_per_token(tokenizer: Tokenizer, texts: Sequence[str]) -> float:
    """UTF-8 bytes per token over `texts` (EOS counted), to cut shards near --tokens-per-shard; of a long
    document, its first PIECE_CHARS only (they say enough, in bounded memory)."""
    if not texts:
        return 4.0
    texts = [t[:PIECE_CHARS] for t in texts]
    num_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    num_tokens = sum(len(ids) for ids in tokenizer.encode_batch(texts)) + len(texts)
    return max(num_bytes / num_tokens, 0.25)


def as_token_array(ids: Sequence[int] | np.ndarray, eos_id: int, dtype: str) -> np.ndarray:
    """One document's ids and its EOS as a little-endian array of the dataset's dtype."""
    out = np.empty(len(ids) + 1, dtype="<u2" if dtype == "uint16" else "<u4")
    ids = np.asarray(ids)
    if len(ids) and int(ids.max()) > np.iinfo(out.dtype).max:  # (load_tokenizer's _check_ids refuses this first)
        raise ValueError(f"token id {int(ids.max())} does not fit the dataset's {dtype}")
    out[:-1] = ids
    out[-1] = eos_id
    return out
