"""`shardify inspect`: what a dataset holds, as rich tables: totals, fields, shards, labels, skipped samples."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from dataio.errors import ShardifyError
from dataio.format.manifest import Manifest
from dataio.format.tar_index import parse_index
from dataio.format.versions import JOURNAL_HEAD, VERSIONS_DIR, generation_of, read_journal
from dataio.storage.store import Store, redact
from sharding.write.config import without_used_advice


def _label_column(m: Manifest) -> str | None:
    """`cls`, else (Parquet, e.g. a Hugging Face export) an integer `label` column, as the loader reads it."""
    types = {f.name: f.type for f in m.fields}
    if "cls" in types:
        return "cls"
    return "label" if m.format == "parquet" and types.get("label") == "int" else None


def label_counts(store: Store, manifest: Manifest, unreadable: list[str] | None = None) -> Counter[int]:
    """Samples per label, read from the shards (Parquet: the `cls` column; tar: each `.cls` member).

    A shard that cannot be read (deleted, truncated, no permission) is left out and described in
    `unreadable` when given, else its error is raised.
    """
    counts: Counter[int] = Counter()
    column = _label_column(manifest)
    if column is None:
        return counts
    for i in range(manifest.num_shards):
        shard = manifest.shard(i)
        try:
            counts.update(_shard_labels(store, manifest, shard, column))
        except (ShardifyError, OSError) as exc:
            if unreadable is None:
                raise
            text = str(exc) if isinstance(exc, ShardifyError) else f"{type(exc).__name__}: {exc.strerror or exc}"
            unreadable.append(f"{store.url_of(shard.path)}: cannot read ({redact(text)})")
    return counts


def _shard_labels(store: Store, manifest: Manifest, shard: Any, column: str) -> Counter[int]:
    counts: Counter[int] = Counter()
    if manifest.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # A BufferReader, not io.BytesIO: pyarrow's threaded read of a Python file object can abort
        # the interpreter at exit ("terminate called without an active exception").
        table = pq.read_table(pa.BufferReader(store.read(shard.path)), columns=[column])
        counts.update(v for v in table.column(column).to_pylist() if v is not None)
        return counts
    index = parse_index(store.read(shard.index_path or "", expect_size=shard.index_bytes),
                        url=store.url_of(shard.index_path or ""))
    # Members are read in file order through one handle, so remote stores stream (readahead).
    with store.fs.open(store.path(shard.path), "rb") as f:
        for sample in index.samples:
            for m in sample.members:
                if m.ext == "cls":
                    f.seek(m.offset)
                    text = f.read(m.size).strip()
                    counts[int(text) if text.isdigit() else -1] += 1
    return counts


def write_options(store: Store, m: Manifest) -> dict[str, Any] | None:
    """The options of the write that published `m` (its journal's head), None where no journal names it
    (a dataset written before journals, or made by `shardify index`). Lists only versions/, never the shards."""
    try:
        heads = [rel.split("/")[0] for rel in store.child(VERSIONS_DIR).list() if rel.endswith(f"/{JOURNAL_HEAD}")]
        for version in sorted(heads, key=generation_of, reverse=True):  # the newest is the likeliest
            head, _ = read_journal(store, version, [])
            if head.manifest_fingerprint == m.fingerprint:
                return dict(head.options)
    except (ShardifyError, OSError, ValueError):
        pass  # unreadable journals: the options are unknown, nothing else is at stake
    return None


def _human(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if num_bytes < 1000 or unit == "TB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1000
    raise AssertionError("unreachable")


def summary_table(store: Store, m: Manifest, options: dict[str, Any] | None = None) -> Table:
    t = Table(title=f"dataset {store.url}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    rows = [
        ("format", m.format), ("shards", str(m.num_shards)), ("samples", str(m.num_samples)),
        ("bytes", f"{m.num_bytes} ({_human(m.num_bytes)})"),
        ("fields", ", ".join(f"{f.name}:{f.type}" for f in m.fields)),
        ("labels", "-" if m.label_names is None else f"{len(m.label_names)} names"),
        ("skipped", str(len(m.skipped))), ("source", m.source or "-"),
        ("written by", f"shardify {m.tool_version} at {m.created_utc}"),
        ("manifest", ("one JSON file" if m.parted is None else
         f"JSON root + {len(m.part_paths)} Parquet parts ({m.part_paths[0].rsplit('/', 1)[0]}/)")
         + f", version {m.version}"),
        ("read checks", ("per sample (.sums sidecars)" if m.format == "tar" else "per row group's column chunks")
         if m.has_read_checksums else "sizes only: written before per-sample checksums (rewrite to add them)"),
    ]
    if options:
        rows.append(("write options", ", ".join(f"{k}={v}" for k, v in options.items() if v is not None)))
    for row in rows:
        t.add_row(*row)
    return t


def shards_table(store: Store, m: Manifest, max_rows: int) -> Table:
    t = Table(title=f"shards ({m.num_shards})")
    for name in ("#", "path", "samples", "bytes", "checksum", "index" if m.format == "tar" else "row groups"):
        # Paths never wrap or shorten: people copy them into other commands.
        short = name in ("#", "samples", "bytes")  # never squeezed to nothing on a narrow terminal
        t.add_column(name, justify="right" if short else "left", no_wrap=name in ("path", "index", "checksum"),
                     overflow="fold", min_width=max(len(name), 5) if short else None)
    show = list(range(m.num_shards))
    if len(show) > max_rows:
        show = show[: max_rows // 2] + [-1] + show[-(max_rows - max_rows // 2) :]
    for i in show:
        if i < 0:
            t.add_row("...", f"{m.num_shards - max_rows} more", "", "", "", "")
            continue
        s = m.shard(i)
        extra = s.index_path or "" if m.format == "tar" else ",".join(map(str, s.row_groups or ()))
        t.add_row(str(i), s.path, str(s.num_samples), _human(s.num_bytes), s.checksum, extra)
    return t


def labels_table(m: Manifest, counts: Counter[int]) -> Table:
    t = Table(title="label histogram")
    for name, justify in (("label", "right"), ("name", "left"), ("samples", "right"), ("share", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    total = max(1, sum(counts.values()))
    names = m.label_names or ()
    for label, n in sorted(counts.items()):
        name = names[label] if 0 <= label < len(names) else ("(not an int)" if label < 0 else "")
        t.add_row(str(label), name, str(n), f"{100 * n / total:.1f}%")
    return t


def skipped_table(m: Manifest, max_rows: int, options: dict[str, Any] | None = None) -> Table:
    """The skipped samples and why, without advice to use an option the write used (a sample is skipped
    only under --on-error skip: that much is known without a journal)."""
    used = {**(options or {}), "on_error": "skip"}  # (an append's older rows too, whatever its own option)
    t = Table(title=f"skipped samples ({len(m.skipped)})")
    for name in ("key", "source", "reason"):
        t.add_column(name, overflow="fold")
    for s in m.skipped[:max_rows]:
        t.add_row(s.get("key", ""), s.get("source", ""), without_used_advice(s.get("reason", ""), used))
    if len(m.skipped) > max_rows:
        t.add_row("...", f"{len(m.skipped) - max_rows} more", "")
    return t


def print_inspect(store: Store, m: Manifest, console: Console, *, max_rows: int = 20, labels: bool = True) -> list[str]:
    """Print every table; the label histogram reads the labels from the shards (skip with labels=False).

    Returns the shards that could not be read for the histogram (it counts the others), each said
    on the console with what to do."""
    options = write_options(store, m)
    console.print(summary_table(store, m, options))
    console.print(shards_table(store, m, max_rows))
    unreadable: list[str] = []
    if labels and _label_column(m) is not None:
        console.print(labels_table(m, label_counts(store, m, unreadable)))
    if m.skipped:
        console.print(skipped_table(m, max_rows, options))
    for line in unreadable:
        console.print(f"PROBLEM {line}", markup=False, highlight=False)
    if unreadable:
        console.print(f"{len(unreadable)} shard(s) could not be read (the label histogram leaves them out); "
                      f"run `shardify verify {store.url}`, then restore them or rewrite the dataset",
                      markup=False, highlight=False)
    return unreadable
