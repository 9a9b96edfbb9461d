"""Token shards for `shardify write --tokenizer`: one worker's shard of documents, tokenized in batches by
the Rust tokenizer, each ended by EOS, written as dataio/format/token_layout.py lays out; and the manifest.

It runs inside the one write engine (sharding/write/writer.py: plan, workers, journal, versions): the
engine calls `write_token_shard` where it writes a tar or Parquet shard (sharding/write/shard.py).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dataio.errors import CorruptSampleError, ShardifyError
from dataio.format.checksums import Checksummer, checksum_bytes
from dataio.format.manifest import Manifest
from dataio.format.provenance import dumps_sources, sources_path
from dataio.format.token_layout import (
    DTYPES,
    OFFSET_DTYPE,
    SUM_DTYPE,
    TokensInfo,
    block_sums,
    offsets_path,
    token_sums_path,
)
from dataio.storage.store import redact
from sharding.sources.base import RawSample, Ref, Source, SourceError
from sharding.sources.text import TextSource, sample_texts
from sharding.write.config import ShardResult, ShardTask, TokenOptions, WriteConfig, WriteJob
from sharding.write.tokenizer import Tokenizer, as_token_array, bytes_per_token, load_tokenizer

ENCODE_BATCH = 256  # documents per encode_batch call: enough for the tokenizer's threads, little memory
DEFAULT_TOKENS_PER_SHARD = 1 << 27  # 256 MiB of uint16 tokens, the size of a default image shard


def token_write_config(source: TextSource, base: WriteConfig, *, tokenizer: str, eos_token: str | None = None,
                       min_tokens: int = 0, max_tokens: int | None = None,
                       tokens_per_shard: int = DEFAULT_TOKENS_PER_SHARD) -> WriteConfig:
    """`base` (workers, engine, ...) writing token shards of about `tokens_per_shard` tokens: shards are cut
    by source bytes, at the bytes per token the tokenizer gives the source's first documents."""
    tok = load_tokenizer(tokenizer, eos_token=eos_token)
    tokens = TokenOptions(tokenizer=tokenizer, tokenizer_hash=tok.info.file_hash, eos_token=eos_token,
                          min_tokens=min_tokens, max_tokens=max_tokens)
    fields = {f: getattr(base, f) for f in WriteConfig.__dataclass_fields__ if f not in ("format", "tokens")}
    fields["shard_size_bytes"] = max(1, int(tokens_per_shard * bytes_per_token(tok, sample_texts(source))))
    return WriteConfig(**fields, format="tokens", tokens=tokens)


class TokenShardWriter:
    """Streams documents' tokens into a shard file; keeps its checksum, offsets and block checksums."""

    def __init__(self, f: Any, dtype: str, block_tokens: int) -> None:
        self.f, self.dtype, self.block_tokens = f, DTYPES[dtype], block_tokens
        self.checksum = Checksummer()
        self._lengths: list[int] = []
        self._sums: list[np.ndarray] = []
        self._carry = np.empty(0, dtype=self.dtype)  # the tokens of the block being filled

    def add(self, documents: Sequence[np.ndarray]) -> None:
        """Append whole documents (each already ended by EOS)."""
        if not documents:
            return
        data = np.concatenate(documents).astype(self.dtype, copy=False)
        self._lengths += [len(d) for d in documents]
        raw = data.tobytes()
        self.f.write(raw)
        self.checksum.update(raw)
        buf = np.concatenate([self._carry, data])
        full = len(buf) // self.block_tokens * self.block_tokens
        if full:
            self._sums.append(block_sums(buf[:full], self.block_tokens))
        self._carry = buf[full:]

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets [num_documents + 1] int64, block checksums uint64) of everything added."""
        if len(self._carry):
            self._sums.append(block_sums(self._carry, self.block_tokens))
        offsets = np.zeros(len(self._lengths) + 1, dtype=OFFSET_DTYPE)
        np.cumsum(self._lengths, out=offsets[1:])
        sums = np.concatenate(self._sums) if self._sums else np.empty(0, dtype=SUM_DTYPE)
        return offsets, sums.astype(SUM_DTYPE, copy=False)

    @property
    def num_documents(self) -> int:
        return len(self._lengths)


def tokenizer_of(config: WriteConfig) -> Tokenizer:
    """The write's tokenizer, loaded in this process; refused if its file changed since the write began."""
    opts = config.tokens
    assert opts is not None
    tok = load_tokenizer(opts.tokenizer, eos_token=opts.eos_token)
    if tok.info.file_hash != opts.tokenizer_hash:
        raise SourceError(f"{opts.tokenizer}: the tokenizer file changed while writing ({opts.tokenizer_hash} -> "
                          f"{tok.info.file_hash}); write again with one tokenizer")
    return tok


def _documents(source: Source, refs: Sequence[Ref], config: WriteConfig, skipped: list[dict[str, str]],
               report: Callable[[int, int], None]) -> Iterator[list[RawSample]]:
    """The loaded documents in chunks of ENCODE_BATCH; a failed load raises (or is skipped with --on-error skip)."""
    chunk: list[RawSample] = []
    num_bytes = 0
    for ref, loaded in source.load(refs):
        if isinstance(loaded, Exception):
            where = getattr(loaded, "where", source.description)
            if config.on_error == "fail" or not isinstance(loaded, ShardifyError | OSError):
                raise CorruptSampleError(redact(str(loaded)), url=where, key=ref.key) from None
            skipped.append({"key": ref.key, "source": redact(where), "reason": redact(str(loaded))})
            continue
        chunk.append(loaded)
        num_bytes += ref.size_bytes
        if len(chunk) == ENCODE_BATCH:
            yield chunk
            report(len(chunk), num_bytes)
            chunk, num_bytes = [], 0
    if chunk:
        yield chunk
    report(len(chunk), num_bytes)


def write_token_shard(job: WriteJob, task: ShardTask, report: Callable[[int, int], None], *,
                      durable: bool = True) -> ShardResult:
    """Tokenize one shard's documents, write its tokens, offsets, block checksums and provenance."""
    source, dest, config, rel = job.source, job.dest, job.config, task.path
    opts, tok = config.tokens, tokenizer_of(config)
    assert opts is not None
    skipped: list[dict[str, str]] = []
    dropped: Counter[str] = Counter()
    origins: list[str] = []
    with dest.open_atomic(rel, durable=durable) as f:
        writer = TokenShardWriter(f, tok.dtype, opts.block_tokens)
        for chunk in _documents(source, task.refs, config, skipped, report):
            kept = []
            for sample, ids in zip(chunk, tok.encode_batch([s.extras["text"] for s in chunk])):
                if len(ids) < opts.min_tokens:
                    dropped["too_short"] += 1
                elif opts.max_tokens is not None and len(ids) > opts.max_tokens:
                    dropped["too_long"] += 1
                else:
                    kept.append(as_token_array(ids, tok.info.eos_id, tok.dtype))
                    origins.append(sample.origin or sample.where)
            writer.add(kept)
        offsets, sums = writer.close()
    checksum = writer.checksum.hexdigest()
    common = dict(index=task.index, path=rel, num_samples=writer.num_documents, num_bytes=writer.checksum.num_bytes,
                  checksum=checksum, skipped=tuple(skipped), dropped=tuple(sorted(dropped.items())))
    if writer.num_documents == 0:
        dest.remove(rel)
        return ShardResult(**common, num_tokens=0)
    index_data, sums_data = offsets.tobytes(), sums.tobytes()
    dest.write_bytes(sources_path(rel), dumps_sources(rel, checksum, [redact(o) for o in origins]), durable=durable)
    dest.write_bytes(offsets_path(rel), index_data, durable=durable)
    dest.write_bytes(token_sums_path(rel), sums_data, durable=durable)
    return ShardResult(**common, index_path=offsets_path(rel), index_bytes=len(index_data),
                       index_checksum=checksum_bytes(index_data), sums_checksum=checksum_bytes(sums_data),
                       num_tokens=int(offsets[-1]))


def tokens_info(config: WriteConfig) -> TokensInfo:
    """The manifest's tokens section for this write's tokenizer and options."""
    tok = tokenizer_of(config)
    assert config.tokens is not None
    return TokensInfo(tokenizer=tok.info, dtype=tok.dtype, block_tokens=config.tokens.block_tokens)


def token_manifest(results: list[ShardResult], source: Source, config: WriteConfig, tool_version: str) -> Manifest:
    """The manifest of a token dataset: a shard per non-empty result, in shard order."""
    ordered = sorted(results, key=lambda r: r.index)
    kept = [r for r in ordered if r.num_samples]
    return Manifest(
        format="tokens", fields=(),
        shard_paths=tuple(r.path for r in kept), shard_num_samples=tuple(r.num_samples for r in kept),
        shard_num_bytes=tuple(r.num_bytes for r in kept), shard_checksums=tuple(r.checksum for r in kept),
        index_paths=tuple(r.index_path or "" for r in kept), index_num_bytes=tuple(r.index_bytes or 0 for r in kept),
        index_checksums=tuple(r.index_checksum or "" for r in kept),
        sums_checksums=tuple(r.sums_checksum or "" for r in kept),
        shard_num_tokens=tuple(r.num_tokens or 0 for r in kept), tokens=tokens_info(config),
        tool_version=tool_version, created_utc=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        source=redact(source.description), label_names=None,
        skipped=tuple(s for r in ordered for s in r.skipped),
    )


def dropped_counts(results: Sequence[ShardResult]) -> dict[str, int]:
    """Documents the workers left out, by reason, over every shard."""
    total: Counter[str] = Counter()
    for r in results:
        total.update(dict(r.dropped))
    return dict(total)


def check_token_append(old: Manifest, config: WriteConfig, where: str) -> None:
    """SourceError unless the new documents are tokenized as the dataset's were (same tokenizer file)."""
    if config.tokens is None:
        raise SourceError(f"{where}: the dataset holds token shards; append text to it with --tokenizer FILE (the "
                          f"dataset's tokenizer, {old.tokens.tokenizer.name if old.tokens else '?'})")
    new = tokens_info(config)
    if old.format != "tokens" or old.tokens is None:
        raise SourceError(f"{where}: the dataset holds {old.format} shards, not tokens; append text only to a "
                          "token dataset")
    if old.tokens.tokenizer.file_hash != new.tokenizer.file_hash or old.tokens.dtype != new.dtype:
        raise SourceError(f"{where}: the dataset was tokenized by {old.tokens.tokenizer.name} "
                          f"({old.tokens.tokenizer.file_hash}), not by {new.tokenizer.name} ({new.tokenizer.file_hash}); "
                          "append with the dataset's tokenizer")
    if old.tokens.block_tokens != new.block_tokens:
        raise SourceError(f"{where}: the dataset's checksum blocks hold {old.tokens.block_tokens} tokens; append "
                          "with the same block size")


def appended_token_manifest(old: Manifest, new: Manifest) -> Manifest:
    """The old dataset's token shards, then the new ones, under the dataset's tokens section."""
    def both(name: str) -> tuple:
        return tuple(getattr(old, name)) + tuple(getattr(new, name))

    return replace(new, shard_paths=both("shard_paths"), shard_num_samples=both("shard_num_samples"),
                   shard_num_bytes=both("shard_num_bytes"), shard_checksums=both("shard_checksums"),
                   index_paths=both("index_paths"), index_num_bytes=both("index_num_bytes"),
                   index_checksums=both("index_checksums"), sums_checksums=both("sums_checksums"),
                   shard_num_tokens=both("shard_num_tokens"), tokens=old.tokens,
                   source=f"{old.source} + {new.source}", skipped=both("skipped"), _fingerprint=[], parted=None)
