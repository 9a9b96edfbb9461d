"""The `shardify` command: write, inspect and verify datasets of tar or Parquet shards.

Exit codes: 0 fine, 1 `verify` found data problems, 2 bad input or usage, or a destination another
command holds (one message, no traceback), 130 interrupted. Credentials never print: every message
passes `redact`.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from functools import partial

from dataio.decode.images import DEFAULT_MAX_PIXELS
from dataio.errors import ShardifyError
from dataio.format.manifest import read_manifest
from dataio.format.manifest_parts import PARTS_THRESHOLD
from dataio.storage.cloud_options import AZURE_PROTOCOLS, GCS_PROTOCOLS
from dataio.storage.redact import split_userinfo, url_secrets
from dataio.storage.store import StorageOptions, Store, redact, with_retry
from sharding.flags import label_names, num_cores, parse_duration, parse_size, positive_int, positive_seconds
from sharding.text_cli import add_text_flags, add_tokenizer_parser, tokenizer_command, write_text
from sharding.which import add_which_parser, which_command


def _storage_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("object storage (else the AWS_* environment variables)")
    g.add_argument("--endpoint-url", help="S3 endpoint, e.g. http://127.0.0.1:8333")
    g.add_argument("--access-key", help="S3 access key id")
    g.add_argument("--secret-key", help="S3 secret access key")
    g.add_argument("--region", help="S3 region")
    g.add_argument("--gcs-endpoint-url", metavar="URL",
                   help="Google Cloud Storage endpoint for gs:// URLs, e.g. a fake-gcs-server at "
                        "http://127.0.0.1:4443 (else [gcs] endpoint_url, else STORAGE_EMULATOR_HOST, else Google's)")
    g.add_argument("--storage-config", metavar="TOML",
                   help="a TOML file with an [s3] table of the same keys, a [gcs] table (endpoint_url, token: a "
                        "service-account JSON path, project) and an [azure] table (account_name with account_key "
                        "or sas_token, or connection_string); see the object-storage guide")
    g.add_argument("--retry-budget", type=positive_seconds, metavar="SECONDS",
                   help="how long each storage request may retry transient errors (503, resets, timeouts) "
                        "in all, with backoff (default 120; the first request: at most 30)")


def _sample_flags(p: argparse.ArgumentParser) -> None:
    """Flags `write` and `append` share: how samples are read, checked and cut into shards."""
    p.add_argument("--shard-size", type=parse_size, default=parse_size("256MB"), help="bytes per shard (default 256MB)")
    p.add_argument("--max-samples-per-shard", type=positive_int)
    p.add_argument("--shuffle", action="store_true", help="shuffle samples across shards at write time")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument("--workers", type=positive_int, default=num_cores(), help="processes (default: all cores)")
    p.add_argument("--max-side", type=positive_int, help="downscale images so the longer side is at most this")
    p.add_argument("--max-pixels", type=positive_int, default=DEFAULT_MAX_PIXELS, help="refuse larger images")
    p.add_argument("--validate", choices=("structure", "full", "header"), default="structure",
                   help="structure: walk each file's framing to its end marker, catching truncation and "
                        "damaged structure, decoding only what the walk cannot vouch for (default); "
                        "full: decode every pixel; header: format and pixel limit only")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail", help="unreadable samples: stop, or skip and list them")
    p.add_argument("--image-column", help="table column with image paths or bytes (default: guessed)")
    p.add_argument("--label-column", help="table column with labels (default: label/cls/class/target if present)")
    p.add_argument("--key-column", help="table column with unique sample keys (default: row number)")
    p.add_argument("--captions", nargs="?", const="", metavar="FIELD",
                   help="write image-text pairs: a folder of x.jpg + x.txt (+ x.json), tars with txt members "
                        "(img2dataset's), or a table with a caption column (FIELD, else caption/text/txt); "
                        "missing, empty or non-UTF-8 captions are refused naming the sample (or --on-error skip)")
    p.add_argument("--label-names", type=label_names, metavar="A,B,C|@FILE",
                   help="class names in label order (label i is the i-th name): fixes the order of named labels "
                        "in a table or of class folders (default: sorted), or names the integer labels of tars")
    p.add_argument("--follow-symlinks", action=argparse.BooleanOptionalAction, default=True,
                   help="follow symlinked directories in an image folder, each real file once, loops detected "
                        "(default), or skip them")
    p.add_argument("--key", choices=("index", "path"), default="index",
                   help="sample keys: index (000042, the scan order) or path (the relative path, sanitised: "
                        "cat/img_1 for cat/img 1.jpg; unique and the same on every re-run)")
    p.add_argument("--journal-every", type=positive_seconds, default=2.0, metavar="SECONDS",
                   help="how often the write journal records the shards written so far, which an interrupted "
                        "write resumes from (--resume; default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, only a summary")
    add_text_flags(p)
    _storage_flags(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardify", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("write", help="turn an image folder, a table or tar shards into a dataset")
    w.add_argument("src", help="image folder (ROOT/CLASS/IMG), table (.csv/.jsonl/.parquet), .tar (or .tar.gz, .tgz, "
                   ".tar.bz2, .tar.xz, .tar.zst), dir of them, or brace pattern")
    w.add_argument("dest", help="dataset prefix: a local directory or a URL (s3://bucket/prefix)")
    w.add_argument("--format", choices=("tar", "parquet"), default="tar")
    w.add_argument("--overwrite", action="store_true",
                   help="write a new version of the dataset at DEST beside the old one; the manifest switches "
                        "atomically when it is complete, the old shards go after the grace period (shardify gc)")
    w.add_argument("--prefixes", type=positive_int, metavar="N",
                   help="spread shards over N hashed directories (shards/7f/...) so S3's per-prefix request "
                        "limits are not hit (default: 1 up to 10k shards, then one per ~10k shards)")
    w.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: --workers processes here (default); ray: one Ray task per shard, on a local Ray "
                        "started for the run (--workers CPUs, 127.0.0.1 only) or the cluster at --ray-address")
    w.add_argument("--ray-address", metavar="HOST:PORT", help="with --engine ray: join this Ray cluster")
    w.add_argument("--manifest-parts-above", type=int, default=PARTS_THRESHOLD, metavar="SHARDS",
                   help="more shards than this: a small JSON root plus Parquet parts instead of one JSON "
                        f"manifest (default {PARTS_THRESHOLD})")
    w.add_argument("--resume", action="store_true",
                   help="continue DEST's interrupted write (same SRC and options): keep the shards its journal "
                        "confirmed, write the rest")
    _sample_flags(w)

    a = sub.add_parser("append", help="add SRC's samples to the dataset at DATASET as new shards (a new version)")
    a.add_argument("src", help="image folder, table or tar shards, as for write")
    a.add_argument("dest", metavar="DATASET", help="an existing dataset (its format, fields and labels are kept)")
    _sample_flags(a)

    i = sub.add_parser("inspect", help="show a dataset's shards, fields and label histogram")
    i.add_argument("url")
    i.add_argument("--max-rows", type=positive_int, default=20, help="shard and skipped rows to show")
    i.add_argument("--no-labels", action="store_true", help="skip the label histogram (it reads the labels)")
    i.add_argument("--urls", metavar="FILE",
                   help="write every shard's URL, one a line, to FILE ('-': stdout) for webdataset, DALI or "
                        "other tools, and print nothing else")
    i.add_argument("--show", type=positive_int, default=0, metavar="N",
                   help="token datasets: print the first N documents (as text with --tokenizer, else as ids)")
    i.add_argument("--tokenizer", metavar="FILE", help="token datasets: the dataset's tokenizer, to decode --show; "
                   "image-text pairs: caption lengths in its tokens (else in characters)")
    _storage_flags(i)

    x = sub.add_parser("index", help="make existing Parquet files (e.g. a Hugging Face export) a dataset: "
                                     "write our manifest beside them, rewriting nothing")
    x.add_argument("url", help="prefix holding the .parquet files (local directory or s3://bucket/prefix)")
    x.add_argument("--overwrite", action="store_true", help="replace a manifest already there")
    _storage_flags(x)

    g = sub.add_parser("gc", help="delete old versions' shards after their grace period, abandoned writes' "
                                  "leftovers and stale multipart uploads")
    g.add_argument("url")
    g.add_argument("--grace", type=parse_duration, default=3600.0, metavar="DURATION",
                   help="keep what a version retired or a write touched less than this ago (default 1h; "
                        "e.g. 30m, 2h, 1d, 0)")
    g.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    _storage_flags(g)

    v = sub.add_parser("verify", help="check every shard, index, sample and image against the manifest")
    v.add_argument("url")
    v.add_argument("--workers", type=positive_int, default=num_cores())
    v.add_argument("--max-pixels", type=positive_int, default=DEFAULT_MAX_PIXELS)
    v.add_argument("--quiet", action="store_true")
    _storage_flags(v)
    add_tokenizer_parser(sub, _storage_flags)
    add_which_parser(sub, _storage_flags)
    return parser


def _options(args: argparse.Namespace) -> StorageOptions:
    return StorageOptions.resolve(
        endpoint_url=args.endpoint_url, key=args.access_key, secret=args.secret_key, region=args.region,
        config_path=args.storage_config, env=os.environ, retry_budget_s=args.retry_budget,
        gcs_endpoint_url=args.gcs_endpoint_url,
    )


def _check_reachable(store: Store) -> None:
    """Fail fast (within 30 s) when a remote prefix's endpoint, bucket or credentials are wrong."""
    if store.is_local:
        return
    options = replace(store.options, connect_timeout_s=min(store.options.connect_timeout_s, 3.0))
    # One budget over every try of the probe: a stuck endpoint (accepts, never answers) fails
    # within FIRST_REQUEST_DEADLINE_S (30 s), a refused connection after a few tries.
    probe = Store(store.raw_url, options, store.retry).first_request()
    bucket = split_userinfo(store.raw_url)[0].split("://", 1)[1].split("/", 1)[0]
    try:
        probe.list()
        if not with_retry(lambda: probe.fs.exists(bucket), what=f"checking bucket {bucket}", policy=probe.retry,
                          secrets=probe.secrets):
            raise ShardifyError(f"{store.url}: bucket {bucket!r} does not exist; create it first")
    except ShardifyError as exc:
        raise ShardifyError(f"{exc}; {_advice(store.protocol)}") from None


def _advice(protocol: str) -> str:
    """What to check when a remote prefix does not answer: the flags and settings of its cloud."""
    if protocol in GCS_PROTOCOLS:
        return ("check --gcs-endpoint-url (is the server up?), the bucket name and the [gcs] token of "
                "--storage-config (or GOOGLE_APPLICATION_CREDENTIALS)")
    if protocol in AZURE_PROTOCOLS:
        return ("check the container name and the [azure] account_name and account_key, connection_string or "
                "sas_token of --storage-config (or the AZURE_STORAGE_* variables)")
    return "check --endpoint-url (is the server up?), the bucket name and --access-key/--secret-key"


def _write(args: argparse.Namespace) -> int:
    from sharding.overlap import check_overlap
    from sharding.sources.base import IMAGE_EXT_SET
    from sharding.sources.by_path import open_source
    from sharding.sources.pairs import name_tokenizer, open_pairs
    from sharding.write.writer import WriteConfig, write_with_progress

    options = _options(args)
    append = args.command == "append"
    extra = {} if append else {
        "format": args.format, "overwrite": args.overwrite, "num_prefixes": args.prefixes,
        "parts_threshold": args.manifest_parts_above, "engine": args.engine, "ray_address": args.ray_address}
    config = WriteConfig(
        shard_size_bytes=args.shard_size, max_samples_per_shard=args.max_samples_per_shard,
        shuffle=args.shuffle, seed=args.seed, num_workers=args.workers, max_side=args.max_side,
        max_pixels=args.max_pixels, validate=args.validate, on_error=args.on_error,
        journal_every_s=args.journal_every, **extra,
    )
    resume = getattr(args, "resume", False)
    dest = Store(args.dest, options)
    check_overlap(args.src, args.dest, overwrite=config.overwrite or resume or append,
                  shown_src=redact(args.src, options.secrets), shown_dest=dest.url)
    _check_reachable(dest)
    if args.tokenizer and args.captions is None:  # text into token shards (sharding/text_cli.py)
        return write_text(args, config, dest, options, resume=resume, append=append)
    opener = partial(open_pairs, caption=args.captions) if args.captions is not None else open_source
    source = opener(args.src, storage=options, image_column=args.image_column,
                         label_column=args.label_column, key_column=args.key_column, key=args.key,
                         label_names=args.label_names, follow_symlinks=args.follow_symlinks,
                         log=None if args.quiet else (lambda line: print(line, file=sys.stderr)))
    if args.tokenizer:  # image-text pairs: the captions' tokenizer, named by the manifest
        name_tokenizer(source, args.tokenizer)
    report = write_with_progress(source, dest, config, quiet=args.quiet, resume=resume, append=append)
    m = report.manifest
    print(f"wrote {m.num_samples} samples in {m.num_shards} {m.format} shards ({m.num_bytes / 1e6:.1f} MB) to "
          f"{dest.url} in {report.seconds:.1f} s ({m.num_samples / max(report.seconds, 1e-9):.0f} samples/s)"
          + (f"; skipped {len(m.skipped)} (listed in the manifest)" if m.skipped else "")
          + f"; version {report.version}"
          + (f"; removed {len(report.removed)} object(s) of versions retired more than the grace ago"
             if report.removed else ""))
    if report.lease_note:
        print(f"note: {report.lease_note}")
    for note in getattr(source, "notes", ()):  # image-text pairs: img2dataset's failed downloads
        print(f"note: {note}")
    ignored = getattr(source, "ignored", None)
    if ignored:  # an image format we do not take (.heic, .avif, ...) must not vanish unsaid
        print(f"note: left out {sum(ignored.values())} file(s) that are not images by their extension: "
              + ", ".join(f"{ext} x{n}" for ext, n in sorted(ignored.items(), key=lambda kv: -kv[1])[:8])
              + f" (images: {', '.join(sorted(IMAGE_EXT_SET))}); convert the ones you need")
    if ignored is not None and source.label_names:  # an image folder: a class without images keeps its number
        used = {r.label for r in source.refs}
        empty = [n for i, n in enumerate(source.label_names) if i not in used]
        if empty:
            print(f"note: class folder(s) {empty[:5]} hold no images; their labels are kept (numbered among the "
                  "sorted class names) with no samples")
    columns = getattr(source, "extra_columns", None)
    if columns is not None and not source.has_labels:  # a table: its label column may have another name
        print(f"note: no label column (none named label, cls, class, target or category); the samples are "
              f"unlabeled: pass --label-column NAME (one of {list(columns)[:8]}) to label them")
    unlabeled = [r.key for r in source.refs if r.label is None] if source.has_labels else []
    if unlabeled:  # said, never silent: a loader gives these label -1
        print(f"note: {len(unlabeled)} sample(s) have no label (e.g. {unlabeled[0]!r}: no .cls member or an empty "
              "label cell); loaders give them label -1: fix the source, or mask label < 0 in training")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from sharding.gc import describe, gc_dataset

    store = Store(args.url, _options(args))
    _check_reachable(store)
    report = gc_dataset(store, grace_s=args.grace, dry_run=args.dry_run)
    print("\n".join(describe(report, store.url, dry_run=args.dry_run)))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sharding.inspect import print_inspect

    store = Store(args.url, _options(args))
    _check_reachable(store)
    manifest = read_manifest(store)
    if args.urls:
        lines = "".join(f"{store.url_of(p)}\n" for p in manifest.shard_paths)
        if args.urls == "-":
            sys.stdout.write(lines)
        else:
            with open(args.urls, "w", encoding="utf-8") as f:
                f.write(lines)
        return 0
    # Piped or redirected: wide enough that no column is squeezed and no path shortened.
    console = Console() if sys.stdout.isatty() else Console(width=200, soft_wrap=True)
    if manifest.format == "tokens":
        from sharding.inspect_tokens import print_token_inspect

        print_token_inspect(store, manifest, console, max_rows=args.max_rows, show=args.show, tokenizer=args.tokenizer)
        return 0
    unreadable = print_inspect(store, manifest, console, max_rows=args.max_rows, labels=not args.no_labels)
    if manifest.captions is not None:  # image-text pairs: caption lengths (sharding/inspect_captions.py)
        from sharding.inspect_captions import print_caption_stats

        print_caption_stats(store, manifest, console, tokenizer=args.tokenizer)
    return 1 if unreadable else 0


def _index(args: argparse.Namespace) -> int:
    from sharding.index import index_dataset

    options = _options(args)
    store = Store(args.url, options)
    _check_reachable(store)
    m, without_crcs = index_dataset(store, overwrite=args.overwrite, storage=options)
    images = [f.name for f in m.fields if f.type == "image"]
    print(f"indexed {m.num_samples} samples in {m.num_shards} Parquet files ({m.num_bytes / 1e6:.1f} MB) at "
          f"{store.url}; image field(s) {images or 'none'}; fields {list(m.field_names)}")
    if without_crcs:
        print(f"note: {len(without_crcs)} of the files (first: {without_crcs[0]}) have no page checksums (CRC-32): "
              "a loader with verify_checksums=True reads their row groups bigger than its shuffle_window_bytes "
              "twice, to check each column chunk whole before its rows; `shardify write` rewrites them with them")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from sharding.progress import Progress
    from sharding.verify import verify_dataset

    store = Store(args.url, _options(args))
    _check_reachable(store)
    manifest = read_manifest(store)
    progress = Progress(total_samples=manifest.num_samples, total_bytes=manifest.num_bytes, what="verify",
                        quiet=args.quiet)
    try:
        problems = verify_dataset(store, manifest, max_pixels=args.max_pixels, num_workers=args.workers,
                                  on_shard=progress.update)
    finally:
        progress.close()
    for p in problems:
        print(f"PROBLEM {p}")
    if problems:
        print(f"{store.url}: {len(problems)} problem(s) in {manifest.num_shards} shards; rewrite the dataset "
              "with `shardify write ... --overwrite` or restore the damaged shards", file=sys.stderr)
        return 1
    if manifest.format == "tokens":
        print(f"{store.url}: OK: {manifest.num_shards} token shards, {manifest.num_samples} documents, "
              f"{sum(manifest.shard_num_tokens)} tokens; every checksum matches (every block of tokens), every "
              "document ends with EOS and every id is in the vocabulary")
        return 0
    finer = ("every sample's" if manifest.format == "tar" else "every row group's") if manifest.has_read_checksums else (
        f"no per-sample checksums: manifest version {manifest.version}, written before them")
    print(f"{store.url}: OK: {manifest.num_shards} shards, {manifest.num_samples} samples, "
          f"{manifest.num_bytes} bytes, every checksum matches ({finer}) and every image decodes")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `shardify` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and the reason
        return int(exc.code or 0)
    secrets = tuple(s for s in (getattr(args, "access_key", None), getattr(args, "secret_key", None),
                                os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")) if s)
    for name in ("src", "dest", "url", "run"):
        secrets += url_secrets(getattr(args, name, None) or "")
    try:
        return {"write": _write, "append": _write, "inspect": _inspect, "verify": _verify, "index": _index, "gc": _gc,
                "tokenizer": lambda a: tokenizer_command(a, _options(a)),
                "which": lambda a: which_command(a, _options(a))}[args.command](args)
    except KeyboardInterrupt:
        if args.command == "write":
            print(f"shardify: interrupted; the new version was not published, so {redact(args.dest, secrets)} "
                  "holds what it held before; rerun the same command with --resume to continue it (the shards "
                  "already written are kept)", file=sys.stderr)
        return 130
    except BrokenProcessPool:
        print(f"shardify {args.command}: error: a worker process died (out of memory, or killed); no manifest "
              "was written; rerun with --resume (fewer --workers if memory is short)", file=sys.stderr)
        return 2
    except (ShardifyError, ValueError, OSError) as exc:
        print(f"shardify {args.command}: error: {redact(str(exc), secrets)}", file=sys.stderr)
        return 2


def run() -> None:
    """The console script: main(), then exit without interpreter finalization.

    pyarrow's C++ thread pool can still be joinable when it is destroyed at interpreter exit,
    which aborts a command that already finished ("terminate called without an active
    exception", about one `shardify inspect` of a Parquet dataset in twenty here). Output is
    flushed and every file written is closed by the time main() returns.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
