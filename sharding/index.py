"""`shardify index URL`: make existing Parquet files (a Hugging Face `datasets` export, say) a dataset
without rewriting them: our manifest (counts, row groups, checksums, fields) written beside them.

Every `.parquet` file below the prefix is a shard, in sorted path order; all must share one schema.
A column of structs with `bytes` (Hugging Face's Image feature, `{bytes, path}`) is an image field,
and so is a binary column whose first value is an image; a ClassLabel's names become the
manifest's label names. Files are read once each, in parallel, for their checksums (the whole
file's, and each column chunk's per row group: format/checksums.py).
"""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dataio.decode.images import read_header
from dataio.format.checksums import SpanSums, chunk_span
from dataio.format.manifest import (
    MANIFEST_NAME,
    Checksummer,
    Field,
    Manifest,
    write_manifest,
)
from dataio.format.parquet_pages import Incomplete, parse_page_header
from dataio.storage.store import Store
from sharding.sources.base import SourceError
from sharding.sources.remote import RemoteFiles
from sharding.write.lease import Lease

CHUNK_BYTES = 16 << 20
PARQUET_EXTS = (".parquet", ".pq")


def _field(name: str, arrow_type: Any, sample: Any) -> Field:
    """The manifest field of one column; `sample` is its first non-null value (or None)."""
    if pa.types.is_struct(arrow_type):
        names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
        if "bytes" in names:
            return Field(name=name, type="image")
        return Field(name=name, type="json")
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return Field(name=name, type="int")
    if pa.types.is_floating(arrow_type):
        return Field(name=name, type="float")
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return Field(name=name, type="str")
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return Field(name=name, type="image" if sample and read_header(sample) is not None else "bytes")
    return Field(name=name, type="json")


def _describe(store: Store, rel: str) -> dict[str, Any]:
    """Size, checksum, row groups (with their column chunks' checksums), schema of one file: its
    footer, then every byte once, in pieces."""
    size = store.size(rel)
    md = _footer(store, rel, size)
    summer, spans, page_crcs = Checksummer(), SpanSums(md), True
    for start in range(0, size, CHUNK_BYTES):
        piece = store.read(rel, start, min(size, start + CHUNK_BYTES))
        summer.update(piece)
        spans.update(start, piece)
        if start == 0 and md.num_row_groups:
            page_crcs = _has_page_crcs(piece, chunk_span(md.row_group(0).column(0))[0])
    if summer.num_bytes != size:
        raise SourceError(f"{store.url_of(rel)}: read {summer.num_bytes} bytes of {size}; the file changed while indexing")
    groups = tuple(md.row_group(g).num_rows for g in range(md.num_row_groups))
    return {"rel": rel, "size": size, "checksum": summer.hexdigest(), "groups": groups,
            "group_checksums": spans.hexdigests(), "schema": md.schema.to_arrow_schema(), "page_crcs": page_crcs}


def _has_page_crcs(head: bytes, first_page: int) -> bool:
    """Whether the file's first page (at `first_page` in `head`, the file's first bytes) has a CRC-32:
    writers put one on every page or on none."""
    try:
        return parse_page_header(head, first_page).crc is not None
    except (Incomplete, ValueError):
        return False


def _footer(store: Store, rel: str, size: int) -> Any:
    tail = store.read(rel, max(0, size - (1 << 20)), size)
    try:
        footer_len = int.from_bytes(tail[-8:-4], "little") + 8
        if tail[-4:] != b"PAR1" or footer_len > size:
            raise ValueError("no PAR1 footer")
        if footer_len > len(tail):
            tail = store.read(rel, size - footer_len, size)
        return pq.read_metadata(io.BytesIO(bytes(size - len(tail)) + tail))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise SourceError(f"{store.url_of(rel)}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def _first_values(store: Store, rel: str, schema: pa.Schema) -> dict[str, Any]:
    """The first row's binary values (to tell image bytes from other bytes)."""
    binary = [f.name for f in schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
    if not binary:
        return {}
    with store.fs.open(store.path(rel), "rb") as f:
        batch = next(pq.ParquetFile(f).iter_batches(batch_size=1, columns=binary), None)
    return {} if batch is None else {k: v[0] for k, v in batch.to_pydict().items()}


def label_names_of(schema: pa.Schema, column: str = "label") -> tuple[str, ...] | None:
    """A Hugging Face ClassLabel's names from the schema metadata."""
    meta = (schema.metadata or {}).get(b"huggingface")
    try:
        names = json.loads(meta)["info"]["features"][column]["names"] if meta else None
    except (ValueError, KeyError, TypeError):
        return None
    return tuple(str(n) for n in names) if isinstance(names, list) and names else None


def index_dataset(store: Store, *, overwrite: bool = False, storage: Any = None) -> tuple[Manifest, list[str]]:
    """Write the manifest of the Parquet files below `store`; refuse a prefix that has one unless overwriting.
    Returns it and the files whose pages carry no CRC-32 (a loader checks their big row groups whole first).
    Like a write, it holds the prefix's lease (sharding/write/lease.py): never beside a writer, gc or
    another index of the same prefix (LeaseError, exit 2, naming who holds it)."""
    with Lease(store, "index --overwrite" if overwrite else "index") as lease:
        manifest, without_crcs = _index(store, overwrite=overwrite, storage=storage)
        lease.check()  # a stalled process whose lease was taken over publishes nothing
        write_manifest(store, manifest)
    return manifest, without_crcs


def _index(store: Store, *, overwrite: bool, storage: Any) -> tuple[Manifest, list[str]]:
    files = store.list()
    if MANIFEST_NAME in files and not overwrite:
        raise SourceError(f"{store.url} already has a manifest; pass --overwrite to index it again")
    rels = sorted(f for f in files if f.lower().endswith(PARQUET_EXTS) and not f.rsplit("/", 1)[-1].startswith("."))
    if not rels:
        raise SourceError(f"{store.url}: no .parquet files below this prefix; `shardify index` indexes existing "
                          "Parquet files (use `shardify write SRC DEST` for anything else)")
    described = list(RemoteFiles(storage).map(lambda rel: _describe(store, rel), rels))
    schema = described[0]["schema"]
    for d in described[1:]:
        if not d["schema"].remove_metadata().equals(schema.remove_metadata()):
            raise SourceError(f"{store.url_of(d['rel'])}: its columns differ from {store.url_of(rels[0])}'s "
                              f"({d['schema'].names} vs {schema.names}); index files of one schema only")
    first = _first_values(store, rels[0], schema)
    fields = tuple(_field(f.name, f.type, first.get(f.name)) for f in schema if f.name != "__key__")
    if not any(f.type == "image" for f in fields):
        image_like = [f.name for f in schema if pa.types.is_struct(f.type)]
        if image_like:
            raise SourceError(f"{store.url}: struct column(s) {image_like} have no 'bytes' field, so no image can be "
                              "read; export the images with their bytes (datasets' Image feature) and index again")
    manifest = Manifest(
        format="parquet", fields=fields, shard_paths=tuple(rels),
        shard_num_samples=tuple(sum(d["groups"]) for d in described),
        shard_num_bytes=tuple(d["size"] for d in described), shard_checksums=tuple(d["checksum"] for d in described),
        row_groups=tuple(d["groups"] for d in described), tool_version=_tool_version(),
        row_group_checksums=tuple(d["group_checksums"] for d in described),
        created_utc=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), source=f"shardify index {store.url}",
        label_names=label_names_of(schema, "cls" if "cls" in schema.names else "label"),
    )
    return manifest, [d["rel"] for d in described if not d["page_crcs"]]


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardify")
    except PackageNotFoundError:
        return "0+unknown"
