"""The text side of the `shardify` command: `write`/`append` with --tokenizer (token shards) and
`shardify tokenizer train`. Kept apart from cli.py, which calls in here."""

from __future__ import annotations

import argparse
from typing import Any

from dataio.storage.store import Store
from sharding.sources.text import BAD_UTF8_MODES, TextScan, open_text
from sharding.write.config import WriteConfig
from sharding.write.tokenizer import train_bpe
from sharding.write.token_writer import DEFAULT_TOKENS_PER_SHARD, token_write_config


def _count(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def add_text_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `write` and `append` for text sources (used when --tokenizer is given)."""
    g = p.add_argument_group("text (JSON Lines, Parquet text columns, .txt/.md folders) into token shards")
    g.add_argument("--tokenizer", metavar="FILE",
                   help="tokenize text with this tokenizer.json (Hugging Face tokenizers) or NAME.tiktoken file "
                        "into token shards (make one with `shardify tokenizer train`); with --captions: the captions' "
                        "tokenizer, stored with the pair dataset and named by its manifest")
    g.add_argument("--eos-token", help="the token ending each document (default: the tokenizer's, e.g. <|endoftext|>)")
    g.add_argument("--text-field", default="text", help="JSON field or Parquet column holding the text (default text)")
    g.add_argument("--min-tokens", type=_count, default=0, help="drop (and count) documents with fewer tokens")
    g.add_argument("--max-tokens", type=_count, help="drop (and count) documents with more tokens")
    g.add_argument("--keep-empty", action="store_true", help="keep empty (whitespace-only) documents: just their EOS")
    g.add_argument("--dedup", action="store_true", help="drop exact duplicate documents (by a hash of their text)")
    g.add_argument("--on-bad-utf8", choices=BAD_UTF8_MODES, default="replace",
                   help="bytes that are not UTF-8: replace them with U+FFFD and count the documents (default), or "
                        "refuse the source naming the file and line")
    g.add_argument("--tokens-per-shard", type=_count, default=DEFAULT_TOKENS_PER_SHARD,
                   help=f"about this many tokens per shard (default {DEFAULT_TOKENS_PER_SHARD})")


def add_tokenizer_parser(sub: Any, storage_flags: Any) -> None:
    t = sub.add_parser("tokenizer", help="train a tokenizer on a text corpus (works offline)")
    tsub = t.add_subparsers(dest="tokenizer_command", required=True)
    tr = tsub.add_parser("train", help="train a byte-level BPE tokenizer.json on SRC's documents")
    tr.add_argument("src", help="a JSON Lines / Parquet / .txt file, or a folder or prefix of them")
    tr.add_argument("--vocab-size", type=_count, required=True, help="ids in the vocabulary (EOS included)")
    tr.add_argument("-o", "--output", required=True, help="the tokenizer.json to write")
    tr.add_argument("--text-field", default="text")
    tr.add_argument("--eos-token", default="<|endoftext|>")
    tr.add_argument("--on-bad-utf8", choices=BAD_UTF8_MODES, default="replace")
    storage_flags(tr)


def tokenizer_command(args: argparse.Namespace, options: Any) -> int:
    """`shardify tokenizer train`: train on SRC's documents, save, say what was made."""
    source = open_text(args.src, scan=TextScan(text_field=args.text_field, on_bad_utf8=args.on_bad_utf8),
                       storage=options)
    texts = (s.extras["text"] for _, s in source.load(source.refs) if not isinstance(s, Exception))
    info = train_bpe(texts, args.vocab_size, args.output, eos_token=args.eos_token)
    print(f"trained a byte-level BPE of {info.vocab_size} ids on {len(source.refs)} documents of {source.description}; "
          f"EOS {args.eos_token!r} = {info.eos_id}; wrote {args.output} ({info.file_hash})")
    return 0


def text_config(args: argparse.Namespace, base: WriteConfig, source: Any) -> WriteConfig:
    """The write's config with the token options of the command line."""
    return token_write_config(source, base, tokenizer=args.tokenizer, eos_token=args.eos_token,
                              min_tokens=args.min_tokens, max_tokens=args.max_tokens,
                              tokens_per_shard=args.tokens_per_shard)


def open_text_source(args: argparse.Namespace, options: Any) -> Any:
    scan = TextScan(text_field=args.text_field, on_bad_utf8=args.on_bad_utf8, keep_empty=args.keep_empty,
                    dedup=args.dedup)
    return open_text(args.src, scan=scan, storage=options)


def write_text(args: argparse.Namespace, base: WriteConfig, dest: Store, options: Any, *, resume: bool,
               append: bool) -> int:
    """`shardify write SRC DEST --tokenizer FILE` (and append): token shards, then counts."""
    from sharding.write.writer import write_with_progress

    if base.shuffle or base.max_side is not None:
        raise ValueError("--shuffle and --max-side are for image and table sources; a loader shuffles token "
                         "datasets by sequence")
    source = open_text_source(args, options)
    config = text_config(args, base, source)
    report = write_with_progress(source, dest, config, quiet=args.quiet, resume=resume, append=append)
    m = report.manifest
    assert m.tokens is not None
    counts = source.counts
    print(f"wrote {sum(m.shard_num_tokens)} tokens of {m.num_samples} documents in {m.num_shards} token shards "
          f"({m.tokens.dtype}, {m.num_bytes / 1e6:.1f} MB) to {dest.url} in {report.seconds:.1f} s; tokenizer "
          f"{m.tokens.tokenizer.name} (vocab {m.tokens.tokenizer.vocab_size}, EOS {m.tokens.tokenizer.eos_id}); "
          f"version {report.version}")
    left = {"duplicate": counts["duplicate"], "empty": counts["empty"], **report.dropped}
    print("documents left out: " + ", ".join(f"{k} {v}" for k, v in left.items())
          + f"; documents with bad UTF-8 replaced: {counts['bad_utf8']}" + _named(source.bad_utf8_at)
          + (f"; skipped {len(m.skipped)} unreadable (listed in the manifest)" if m.skipped else ""))
    if report.lease_note:  # as image writes say it (cli.py)
        print(f"note: {report.lease_note}")
    return 0


def _named(where: list[str], most: int = 5) -> str:
    """" (in a, b and 3 more)": the documents a count is about, so they can be found."""
    if not where:
        return ""
    more = f" and {len(where) - most} more" if len(where) > most else ""
    return f" (in {', '.join(where[:most])}{more})"
