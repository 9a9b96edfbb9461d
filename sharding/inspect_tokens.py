"""`shardify inspect` of a token dataset: tokens, documents, the tokenizer, a document length histogram,
the shards, and with --show N the first N documents decoded back to text (given the tokenizer file)."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from dataio.format.manifest import Manifest
from dataio.format.token_layout import OFFSET_DTYPE, document_lengths, offsets_path, read_array, read_shard
from dataio.storage.store import Store
from sharding.inspect import _human, skipped_table
from sharding.sources.base import SourceError
from sharding.write.tokenizer import Tokenizer, load_tokenizer


def token_summary(store: Store, m: Manifest) -> Table:
    assert m.tokens is not None
    tok = m.tokens.tokenizer
    t = Table(title=f"token dataset {store.url}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    num_tokens = sum(m.shard_num_tokens)
    specials = ", ".join(f"{k}={v}" for k, v in sorted(tok.special_ids.items(), key=lambda kv: kv[1])[:8])
    for row in (("format", f"tokens (version {m.tokens.version}), {m.tokens.dtype} little-endian"),
                ("shards", str(m.num_shards)), ("documents", str(m.num_samples)),
                ("tokens", f"{num_tokens} ({num_tokens / max(m.num_samples, 1):.1f} per document, EOS included)"),
                ("bytes", f"{m.num_bytes} ({_human(m.num_bytes)})"),
                ("tokenizer", f"{tok.name} ({tok.kind}), vocab {tok.vocab_size}, EOS {tok.eos_id}, {tok.file_hash}"),
                ("special tokens", specials or "-"),
                ("read checks", f"xxh3-64 per block of {m.tokens.block_tokens} tokens (.sums sidecars)"),
                ("source", m.source or "-"), ("written by", f"shardify {m.tool_version} at {m.created_utc}")):
        t.add_row(*row)
    return t


def length_histogram(lengths: np.ndarray) -> Table:
    """Documents by length in tokens, in power-of-two buckets."""
    t = Table(title="document lengths (tokens, EOS included)")
    for name in ("tokens", "documents", "share"):
        t.add_column(name, justify="right")
    buckets = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    total = max(len(lengths), 1)
    for b, n in zip(*np.unique(buckets, return_counts=True)):
        t.add_row(f"{1 << int(b)}-{(1 << int(b) + 1) - 1}", str(int(n)), f"{100 * n / total:.1f}%")
    return t


def token_shards_table(m: Manifest, max_rows: int) -> Table:
    t = Table(title=f"shards ({m.num_shards})")
    for name in ("#", "path", "documents", "tokens", "bytes", "checksum"):
        t.add_column(name, no_wrap=name in ("path", "checksum"), overflow="fold")
    show = list(range(m.num_shards))
    if len(show) > max_rows:
        show = show[: max_rows // 2] + [-1] + show[-(max_rows - max_rows // 2):]
    for i in show:
        if i < 0:
            t.add_row("...", f"{m.num_shards - max_rows} more", "", "", "", "")
            continue
        t.add_row(str(i), m.shard_paths[i], str(m.shard_num_samples[i]), str(m.shard_num_tokens[i]),
                  _human(m.shard_num_bytes[i]), m.shard_checksums[i])
    return t


def dataset_tokenizer(m: Manifest, path: str) -> Tokenizer:
    """The tokenizer at `path`, refused (by its file's hash) unless it is the one the dataset was written with."""
    assert m.tokens is not None
    tok = load_tokenizer(path, eos_token=_eos_name(m))
    want = m.tokens.tokenizer.file_hash
    if tok.info.file_hash != want:
        raise SourceError(f"{path}: this tokenizer ({tok.info.file_hash}) is not the dataset's ({m.tokens.tokenizer.name}, "
                          f"{want}); give the tokenizer file the dataset was written with")
    return tok


def _eos_name(m: Manifest) -> str | None:
    assert m.tokens is not None
    eos = m.tokens.tokenizer.eos_id
    return next((k for k, v in m.tokens.tokenizer.special_ids.items() if v == eos), None)


def show_documents(store: Store, m: Manifest, num: int, tokenizer: Tokenizer | None, console: Console) -> None:
    """The first `num` documents, decoded (or as ids without a tokenizer), each shard checked on reading."""
    assert m.tokens is not None
    shown = 0
    for i in range(m.num_shards):
        tokens, offsets = read_shard(store, m.shard_paths[i], m.tokens, num_tokens=m.shard_num_tokens[i],
                                     num_documents=m.shard_num_samples[i])
        for d in range(len(offsets) - 1):
            if shown == num:
                return
            ids = tokens[offsets[d]:offsets[d + 1]]
            body = tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids.tolist()))
            console.rule(f"document {shown} (shard {i}, document {d}, {len(ids)} tokens)")
            console.print(body, markup=False, highlight=False)
            shown += 1


def print_token_inspect(store: Store, m: Manifest, console: Console, *, max_rows: int = 20, show: int = 0,
                        tokenizer: str | None = None) -> None:
    """Every table of a token dataset; the length histogram reads each shard's offsets (small)."""
    tok = dataset_tokenizer(m, tokenizer) if tokenizer else None
    console.print(token_summary(store, m))
    lengths = [document_lengths(read_array(store, offsets_path(p), OFFSET_DTYPE)) for p in m.shard_paths]
    console.print(length_histogram(np.concatenate(lengths) if lengths else np.zeros(0, np.int64)))
    console.print(token_shards_table(m, max_rows))
    if m.skipped:
        console.print(skipped_table(m, max_rows))
    if show:
        show_documents(store, m, show, tok, console)
        if tok is None:
            console.print("(token ids: pass --tokenizer FILE, the dataset's tokenizer, to see the text)",
                          markup=False, highlight=False)
