"""The token shard format: text tokenized once at write time, stored as flat arrays numpy reads alone.

A token dataset is a prefix with a manifest of format "tokens" (dataio/format/manifest.py) whose
"tokens" section (`TokensInfo`) names the format version, the token dtype, the checksum block
size and the tokenizer (name, kind, vocabulary size, special token ids, EOS id, a hash of its
file). Each shard is three files, every one a headerless little-endian array:

    shards/shard-000000.tokens   the shard's tokens, documents back to back, each ended by EOS:
                                 uint16 when the vocabulary fits (<= 65,536 ids), else uint32
    shards/shard-000000.idx      int64 document offsets in tokens, num_documents + 1 of them:
                                 document i is tokens[offsets[i]:offsets[i + 1]] (offsets[0] == 0)
    shards/shard-000000.sums     uint64 xxh3-64 of each block of `block_tokens` tokens (the last
                                 block may be shorter): what a reader of part of a shard checks

Locally a shard is `np.memmap(path, dtype="<u2")` (or "<u4"), its offsets
`np.fromfile(idx, "<i8")`; from object storage a reader fetches the blocks covering the token
range it needs (one ranged read) and checks each block against the sidecar. The manifest keeps,
per shard, the documents (its sample count), tokens, bytes and checksum of each file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from dataio.errors import ShardFormatError

TOKENS_FORMAT_VERSION = 1
TOKENS_SUFFIX = ".tokens"
OFFSETS_SUFFIX = ".idx"
SUMS_SUFFIX = ".sums"
DEFAULT_BLOCK_TOKENS = 1 << 16  # 128 KiB of uint16: about one ranged read of a loader's window
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
OFFSET_DTYPE = np.dtype("<i8")
SUM_DTYPE = np.dtype("<u8")


def dtype_for(vocab_size: int, *, where: str = "the tokenizer") -> str:
    """'uint16' when every id of a `vocab_size` vocabulary fits, else 'uint32'; ValueError beyond."""
    if vocab_size < 1:
        raise ValueError(f"{where}: vocabulary size {vocab_size} is not positive")
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise ValueError(f"{where}: a vocabulary of {vocab_size} ids does not fit uint32 token shards (at most "
                     f"{1 << 32}); use a smaller tokenizer")


def tokenizer_hash_of(data: bytes) -> str:
    """"xxh3_64:<hex>" of a tokenizer file's bytes: the identity manifests record (TokenizerInfo.file_hash,
    CaptionsInfo.tokenizer_hash)."""
    return "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)


def tokenizer_file_hash(path: str) -> str:
    """tokenizer_hash_of a file's bytes; ValueError naming a file that cannot be read."""
    try:
        with open(path, "rb") as f:
            return tokenizer_hash_of(f.read())
    except OSError as exc:
        raise ValueError(f"tokenizer {path}: cannot read it ({exc.strerror or exc})") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizerInfo:
    """The tokenizer a token dataset was written with; `file_hash` refuses a different one later."""

    name: str
    kind: str  # "hf" (a tokenizers tokenizer.json) or "tiktoken" (a .tiktoken ranks file)
    vocab_size: int
    eos_id: int
    special_ids: Mapping[str, int] = field(default_factory=dict)
    file_hash: str = ""  # "xxh3_64:<hex>" of the tokenizer's file bytes

    def check_file(self, path: str, *, url: str) -> None:
        """ValueError unless the tokenizer file at `path` is this one (the dataset at `url` was written with it)."""
        got = tokenizer_file_hash(path)
        if got != self.file_hash:
            raise ValueError(f"{url}: tokenized by {self.name!r} ({self.file_hash}), but tokenizer={path} hashes to "
                             f"{got}: its ids would not match the dataset's; pass the dataset's tokenizer, or rewrite "
                             "the dataset with this one")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "special_ids": dict(self.special_ids), "file_hash": self.file_hash}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TokenizerInfo:
        return cls(name=str(doc["name"]), kind=str(doc["kind"]), vocab_size=int(doc["vocab_size"]),
                   eos_id=int(doc["eos_id"]), special_ids={str(k): int(v) for k, v in doc["special_ids"].items()},
                   file_hash=str(doc["file_hash"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class TokensInfo:
    """The manifest's "tokens" section: format version, dtype, checksum block size, tokenizer."""

    tokenizer: TokenizerInfo
    dtype: str
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    version: int = TOKENS_FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"token dtype {self.dtype!r} is not one of {sorted(DTYPES)}")
        if self.block_tokens < 1:
            raise ValueError("block_tokens must be positive")
        if np.iinfo(DTYPES[self.dtype]).max < self.tokenizer.vocab_size - 1:
            raise ValueError(f"tokenizer {self.tokenizer.name!r}: {self.tokenizer.vocab_size} ids do not fit "
                             f"{self.dtype}")

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "dtype": self.dtype, "block_tokens": self.block_tokens,
                "tokenizer": self.tokenizer.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str = "manifest") -> TokensInfo:
        if not isinstance(doc, Mapping) or doc.get("version") != TOKENS_FORMAT_VERSION:
            got = doc.get("version") if isinstance(doc, Mapping) else doc
            raise ValueError(f"{where}: token format version {got!r} is not supported (this shardify reads "
                             f"{TOKENS_FORMAT_VERSION}); upgrade shardify or rewrite the dataset")
        return cls(tokenizer=TokenizerInfo.from_json(doc["tokenizer"]), dtype=str(doc["dtype"]),
                   block_tokens=int(doc["block_tokens"]), version=TOKENS_FORMAT_VERSION)


def offsets_path(shard_path: str) -> str:
    """`shards/shard-000042.tokens` -> `shards/shard-000042.idx`."""
    return shard_path.rsplit(".", 1)[0] + OFFSETS_SUFFIX


def token_sums_path(shard_path: str) -> str:
    """`shards/shard-000042.tokens` -> `shards/shard-000042.sums`."""
    return shard_path.rsplit(".", 1)[0] + SUMS_SUFFIX


def block_sums(tokens: np.ndarray, block_tokens: int) -> np.ndarray:
    """xxh3-64 of each block of `block_tokens` tokens of a little-endian token array (last one short)."""
    data = memoryview(np.ascontiguousarray(tokens)).cast("B")
    step = block_tokens * tokens.dtype.itemsize
    sums = [xxhash.xxh3_64_intdigest(data[i:i + step]) for i in range(0, len(data), step)]
    return np.asarray(sums, dtype=SUM_DTYPE)


def block_range(start: int, stop: int, block_tokens: int, num_tokens: int) -> tuple[int, int, int, int]:
    """(first block, end block, first token, end token) of the whole blocks covering tokens [start, stop)."""
    first, end = start // block_tokens, -(-stop // block_tokens)
    return first, end, first * block_tokens, min(end * block_tokens, num_tokens)


def check_blocks(data: bytes | memoryview, sums: np.ndarray, first_block: int, info: TokensInfo, *,
                 url: str, offsets: np.ndarray | None = None) -> None:
    """Raise ShardFormatError naming the shard and the document when a block of `data` (blocks from
    `first_block` on, whole) does not match its checksum in the sidecar."""
    view = memoryview(data).cast("B")
    step = info.block_tokens * info.np_dtype.itemsize
    for k, pos in enumerate(range(0, len(view), step)):
        block = first_block + k
        if block >= len(sums) or xxhash.xxh3_64_intdigest(view[pos:pos + step]) != int(sums[block]):
            token = block * info.block_tokens
            doc = int(np.searchsorted(offsets, token, side="right") - 1) if offsets is not None else -1
            where = f"document {doc} " if doc >= 0 else ""
            raise ShardFormatError(
                f"{url}: token block {block} ({where}from token {token}) does not match its checksum in "
                f"{token_sums_path(url)}: the shard is corrupt; rewrite the dataset (`shardify write ... --overwrite`)")


def document_lengths(offsets: np.ndarray) -> np.ndarray:
    """Tokens per document (EOS included) from a shard's offsets."""
    return np.diff(np.asarray(offsets, dtype=np.int64))


def check_offsets(offsets: np.ndarray, num_tokens: int, num_documents: int, *, url: str) -> None:
    """ShardFormatError unless `offsets` run from 0 to num_tokens, never backwards, one per document + 1."""
    if (len(offsets) != num_documents + 1 or (len(offsets) and (offsets[0] != 0 or offsets[-1] != num_tokens))
            or bool(np.any(np.diff(offsets) < 1))):
        raise ShardFormatError(
            f"{url}: its document offsets do not describe {num_documents} documents of {num_tokens} tokens "
            "(each at least its EOS): the shard's index is corrupt; rewrite the dataset")


def memmap_tokens(path: str, info: TokensInfo) -> np.ndarray:
    """A local token shard as a read-only memory map (no copy)."""
    return np.memmap(path, dtype=info.np_dtype, mode="r")


def read_token_range(store: Any, rel: str, start: int, stop: int, info: TokensInfo, *, num_tokens: int,
                     sums: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
    """Tokens [start, stop) of the shard `rel`, read by one ranged read of the whole checksum blocks
    around them and checked block by block (works for local and object storage alike)."""
    if not 0 <= start <= stop <= num_tokens:
        raise ValueError(f"token range [{start}, {stop}) is outside the shard's {num_tokens} tokens")
    if start == stop:
        return np.empty(0, dtype=info.np_dtype)
    first, _, lo, hi = block_range(start, stop, info.block_tokens, num_tokens)
    size = info.np_dtype.itemsize
    data = store.read(rel, lo * size, hi * size)
    if len(data) != (hi - lo) * size:
        raise ShardFormatError(f"{store.url_of(rel)}: {len(data)} bytes where tokens {lo}-{hi} need {(hi - lo) * size}: "
                               "the shard is shorter than its manifest says; rewrite the dataset")
    check_blocks(data, sums, first, info, url=store.url_of(rel), offsets=offsets)
    return np.frombuffer(data, dtype=info.np_dtype)[start - lo:stop - lo]


def read_array(store: Any, rel: str, dtype: np.dtype) -> np.ndarray:
    """A whole small sidecar (offsets or sums) as a numpy array."""
    return np.frombuffer(bytes(store.read(rel)), dtype=dtype)


def read_shard(store: Any, rel: str, info: TokensInfo, *, num_tokens: int, num_documents: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets) of a whole shard, every block checked against its sidecar and the offsets
    against the manifest's counts; ShardFormatError names the shard (and the document) at fault."""
    url = store.url_of(rel)
    offsets = read_array(store, offsets_path(rel), OFFSET_DTYPE)
    check_offsets(offsets, num_tokens, num_documents, url=url)
    sums = read_array(store, token_sums_path(rel), SUM_DTYPE)
    if len(sums) != -(-num_tokens // info.block_tokens):
        raise ShardFormatError(f"{url}: its checksum sidecar lists {len(sums)} blocks, the shard has "
                               f"{-(-num_tokens // info.block_tokens)}; rewrite the dataset")
    tokens = read_token_range(store, rel, 0, num_tokens, info, num_tokens=num_tokens, sums=sums, offsets=offsets)
    return tokens, offsets
