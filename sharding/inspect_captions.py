"""`shardify inspect` of an image-text pair dataset: caption length statistics, in tokens with a
tokenizer (what a context length truncates), in characters otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dataio.format.manifest import Manifest
from dataio.format.tar_index import parse_index
from dataio.storage.store import Store

CONTEXT_LENGTHS = (32, 77, 128)  # shown: how many captions a context of this many tokens would cut


def captions(store: Store, manifest: Manifest) -> Iterator[str]:
    """Every sample's caption (the manifest's caption field), shard by shard, as text."""
    assert manifest.captions is not None
    name = manifest.captions.field
    for i in range(manifest.num_shards):
        shard = manifest.shard(i)
        if manifest.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pq.read_table(pa.BufferReader(store.read(shard.path)), columns=[name])
            for value in table.column(name).to_pylist():
                yield value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
            continue
        index = parse_index(store.read(shard.index_path or "", expect_size=shard.index_bytes),
                            url=store.url_of(shard.index_path or ""))
        with store.fs.open(store.path(shard.path), "rb") as f:
            for sample in index.samples:
                for m in sample.members:
                    if m.ext == name:
                        f.seek(m.offset)
                        yield f.read(m.size).decode("utf-8", "replace")


def caption_lengths(texts: list[str], tokenizer: Any = None) -> np.ndarray:
    """Each caption's length: tokens (no end token) with a loaded tokenizer, else characters."""
    if tokenizer is None:
        return np.asarray([len(t) for t in texts], dtype=np.int64)
    return np.asarray([len(ids) for ids in tokenizer.encode_batch(texts)], dtype=np.int64)


def caption_table(lengths: np.ndarray, unit: str) -> Table:
    t = Table(title=f"caption lengths ({unit})")
    for column in ("captions", "min", "mean", "p50", "p95", "max"):
        t.add_column(column, justify="right")
    if len(lengths) == 0:
        t.add_row("0", "-", "-", "-", "-", "-")
        return t
    p50, p95 = np.percentile(lengths, [50, 95])
    t.add_row(str(len(lengths)), str(int(lengths.min())), f"{lengths.mean():.1f}", f"{p50:.0f}", f"{p95:.0f}",
              str(int(lengths.max())))
    return t


def print_caption_stats(store: Store, manifest: Manifest, console: Console, *, tokenizer: str | None) -> None:
    """The caption length table; with a tokenizer file, also how many captions each usual context cuts."""
    loaded = None
    if tokenizer is not None:
        from sharding.write.tokenizer import load_tokenizer

        loaded = load_tokenizer(tokenizer)
    lengths = caption_lengths(list(captions(store, manifest)), loaded)
    console.print(caption_table(lengths, "tokens" if loaded is not None else "characters"))
    if loaded is not None and len(lengths):
        cut = ", ".join(f"{int((lengths + 1 > n).sum())} longer than a context of {n}" for n in CONTEXT_LENGTHS)
        console.print(f"captions truncated (the end token kept): {cut}", markup=False, highlight=False)
