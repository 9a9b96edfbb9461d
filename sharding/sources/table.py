"""A table source: CSV, JSONL or Parquet rows whose columns hold image paths, URLs or bytes, labels, keys, values.

The image column may hold paths (relative to the table), URLs (s3://, ...), raw bytes, or
Hugging Face `datasets`' image struct `{bytes, path}`. Each row's image format comes from its
own bytes (a table may mix JPEG and PNG). The table itself may live in object storage.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataio.decode.images import probe, read_header
from dataio.errors import ShardifyError
from dataio.format.manifest import Field
from sharding.sources.base import (
    IMAGE_EXT_SET,
    RawSample,
    Ref,
    SampleLoadError,
    Source,
    SourceError,
    key_width,
    normalize_ext,
    path_keys,
)
from sharding.sources.labels import to_labels
from sharding.sources.remote import RemoteFiles, is_url

_IMAGE_COLUMN_GUESSES = ("image", "img", "image_path", "path", "file", "filename", "filepath", "jpg", "png")
_LABEL_COLUMN_GUESSES = ("label", "cls", "class", "target", "category")
IMAGE_KINDS = ("path", "bytes", "struct")  # how the image column holds images


def read_tables(paths: Sequence[str], storage: Any = None) -> Any:
    """One table of several files (a Hugging Face export's shards) of one schema, in the order given."""
    import pyarrow as pa

    tables = [_read_table(p, storage) for p in paths]
    for p, t in zip(paths[1:], tables[1:]):
        if not t.schema.remove_metadata().equals(tables[0].schema.remove_metadata()):
            raise SourceError(f"{p}: its columns {t.schema.names} differ from {paths[0]}'s {tables[0].schema.names}; "
                              "write tables of one schema together")
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables([t.replace_schema_metadata(tables[0].schema.metadata) for t in tables])


def _read_table(path: str, storage: Any = None) -> Any:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    lower = path.lower()
    try:
        source: Any = path
        if is_url(path):
            source = pa.BufferReader(RemoteFiles(storage).read(path))
        if lower.endswith(".csv"):
            return pcsv.read_csv(source)
        if lower.endswith((".tsv", ".tab")):
            return pcsv.read_csv(source, parse_options=pcsv.ParseOptions(delimiter="\t"))
        if lower.endswith((".jsonl", ".ndjson")):
            return pjson.read_json(source)
        return pq.read_table(source, memory_map=not is_url(path))
    except ShardifyError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise SourceError(f"{path}: cannot read this table ({type(exc).__name__}: {exc}); check its format") from None


def _field_type(arrow_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return "int"
    if pa.types.is_floating(arrow_type):
        return "float"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "str"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "bytes"
    return "json"


def image_struct_fields(arrow_type: Any) -> tuple[str, ...] | None:
    """The child names of a struct column (Hugging Face's image is `{bytes, path}`); None if not a struct."""
    import pyarrow as pa

    if not pa.types.is_struct(arrow_type):
        return None
    return tuple(arrow_type.field(i).name for i in range(arrow_type.num_fields))


def ext_of_bytes(data: Any) -> str | None:
    """The file extension of image bytes, from their header (PIL for formats the fast parser skips)."""
    header = read_header(data)
    if header is not None and header.format:
        fmt = header.format
    else:
        try:
            fmt = probe(bytes(data))[0]
        except ShardifyError:
            return None
    return normalize_ext({"jpeg": "jpg", "mpo": "jpg", "tiff": "tif"}.get(fmt, fmt))


@dataclass(kw_only=True)
class TableSource(Source):
    path: str
    image_column: str | None
    image_kind: str | None
    extra_columns: tuple[str, ...]
    storage: Any = None
    paths: tuple[str, ...] = ()  # every file of a multi-file table, rows in this order; () is (path,)
    _table: Any = field(default=None, repr=False)

    def _rows(self, rows: list[int]) -> list[dict[str, Any]]:
        if self._table is None:
            self._table = read_tables(self.paths or (self.path,), self.storage)
        columns = [c for c in (self.image_column, *self.extra_columns) if c]
        return self._table.select(columns).take(rows).to_pylist()

    def _image_of(self, row_number: int, value: Any, files: RemoteFiles) -> tuple[bytes, str, str]:
        """(bytes, where, origin) of one row's image; SourceError names the row and what to do."""
        where = f"{self.path} row {row_number}"
        if self.image_kind == "bytes":
            return bytes(value), where, f"row {row_number}"
        if self.image_kind == "struct":
            data, rel = value.get("bytes"), value.get("path")
            if data:
                return bytes(data), where, f"row {row_number}" + (f" ({rel})" if rel else "")
            if not rel:
                raise SourceError(f"{where}: column {self.image_column!r} has neither bytes nor a path in this row")
            value = rel
        if not str(value).strip():
            raise SourceError(f"{where}: column {self.image_column!r} is empty; give the image's path or URL")
        target = resolve(self.path, str(value))
        try:
            return files.read(target), target, str(value)
        except OSError as exc:
            raise SourceError(f"{where}: {target}: cannot read ({exc.strerror or exc}); fix the path "
                              "(relative paths are relative to the table's folder)") from None

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        rows = self._rows([r.loc for r in refs])
        files = RemoteFiles(self.storage)

        def one(item: tuple[Ref, dict[str, Any]]) -> RawSample | Exception:
            ref, row = item
            image, ext, where, origin = None, None, f"{self.path} row {ref.loc}", f"row {ref.loc}"
            try:
                if self.image_column:
                    value = row[self.image_column]
                    if value is None:
                        raise SourceError(f"{where}: column {self.image_column!r} is empty")
                    image, where, origin = self._image_of(ref.loc, value, files)
                    ext = ext_of_bytes(image) or _ext_of_name(origin) or "jpg"
            except (ShardifyError, OSError) as exc:
                value = str(row.get(self.image_column) or "").strip()
                target = resolve(self.path, value) if self.image_kind == "path" and value else where
                text = str(exc) if isinstance(exc, ShardifyError) else f"{target}: cannot read ({exc})"
                return SampleLoadError(text, where=target)
            extras = {c: row[c] for c in self.extra_columns}
            return RawSample(ref.key, ref.label, ext, image, extras, where, origin=origin)

        yield from zip(refs, files.map(one, list(zip(refs, rows))))


def resolve(table: str, value: str) -> str:
    """A path from the table: a URL as it is, else relative to the table's own directory (or URL).

    Windows paths (`imgs\\a.jpg`, a table made there) take `/`; `file://` URLs become paths."""
    if value.startswith("file://"):
        return value.removeprefix("file://")
    if is_url(value):
        return value
    value = value.replace("\\", "/")
    if os.path.isabs(value):
        return value
    if is_url(table):
        return posixpath.join(posixpath.dirname(table), value)
    return os.path.join(os.path.dirname(os.path.abspath(table)), value)


def _ext_of_name(name: str) -> str | None:
    ext = normalize_ext(posixpath.splitext(name.split("?", 1)[0])[1])
    return ext or None


def _pick_column(columns: list[str], asked: str | None, guesses: tuple[str, ...], what: str, flag: str, path: str) -> str | None:
    if asked is not None:
        if asked not in columns:
            raise SourceError(
                f"{path}: no column {asked!r} for the {what}; the table's columns are {columns}; "
                f"pass one of them with {flag}"
            )
        return asked
    lower = {c.lower(): c for c in columns}
    return next((lower[g] for g in guesses if g in lower), None)


def _looks_like_images(table: Any, sample_rows: int = 64) -> str | None:
    """The first column whose first non-empty values are all image paths/URLs (by extension) or
    image bytes (by header): a table whose image column has another name (`img_path`) must not be
    written without its images."""
    head = table.slice(0, sample_rows)
    for name in table.column_names:
        kind = _field_type(table.schema.field(name).type)
        values = [v for v in head.column(name).to_pylist() if v not in (None, "", b"")]
        if not values or kind not in ("str", "bytes", "json"):
            continue
        if kind == "str" and all(_ext_of_name(v.strip()) in IMAGE_EXT_SET for v in values):
            return name
        if kind == "bytes" and all(read_header(v) is not None for v in values):
            return name
        if kind == "json" and all(isinstance(v, dict) and v.get("bytes") and read_header(v["bytes"]) is not None
                                  for v in values):
            return name
    return None


def _image_kind(table: Any, column: str, path: str) -> str:
    arrow_type = table.schema.field(column).type
    children = image_struct_fields(arrow_type)
    if children is not None:
        if "bytes" not in children:
            raise SourceError(
                f"{path}: image column {column!r} is a struct of {list(children)} without 'bytes'; a Hugging "
                "Face image column is {bytes, path}: export it with its bytes (datasets' Image feature), or "
                "pass the column holding the images with --image-column"
            )
        return "struct"
    kind = _field_type(arrow_type)
    if kind == "bytes":
        return "bytes"
    if kind == "str":
        return "path"
    raise SourceError(f"{path}: image column {column!r} holds {kind}, not file paths, URLs or bytes")


def _scan_images(table: Any, column: str, kind: str, path: str, storage: Any) -> tuple[list[int], set[str], list[str]]:
    """(estimated size, image extensions, path-like names for --key path) of every row's image."""
    values = table.column(column).to_pylist()
    if kind == "path":
        targets = [resolve(path, str(v)) if v and str(v).strip() else "" for v in values]
        sizes = RemoteFiles(storage).sizes(targets)
        exts = {_ext_of_name(str(v)) or "jpg" for v in values if v}
        return sizes, exts, [_url_path(str(v or "")) for v in values]
    blobs = [(v or {}).get("bytes") if kind == "struct" else v for v in values]
    exts = {e for e in (ext_of_bytes(b) for b in blobs if b) if e}
    names = [_url_path(str((v or {}).get("path") or "")) for v in values] if kind == "struct" else [""] * len(values)
    sizes = [len(b or b"") for b in blobs]
    if kind == "struct":  # rows that keep only a path (no bytes): the image is read from that path
        exts |= {_ext_of_name(n) or "jpg" for b, n in zip(blobs, names) if not b and n}
    return sizes, exts or {"jpg"}, names


def _url_path(value: str) -> str:
    """The path part of a URL (bucket included), or the path itself."""
    return value.split("://", 1)[1] if "://" in value else value


def open_table(path: str | Sequence[str], *, image_column: str | None, label_column: str | None,
               key_column: str | None, key: str = "index", storage: Any = None, description: str = "",
               label_names: Sequence[str] | None = None) -> TableSource:
    """A CSV/JSONL/Parquet table (or several files of one schema, e.g. a Hugging Face export's shards);
    the image column holds paths (relative to the first table), URLs, bytes or {bytes, path}."""
    paths = (path,) if isinstance(path, str) else tuple(path)
    path = paths[0]
    table = read_tables(paths, storage)
    columns = list(table.column_names)
    if table.num_rows == 0:
        raise SourceError(f"{path}: the table has no rows; nothing to write")
    image_col = _pick_column(columns, image_column, _IMAGE_COLUMN_GUESSES, "image", "--image-column", path)
    if image_col is None and image_column is None:
        image_col = _looks_like_images(table)
    label_col = _pick_column(columns, label_column, _LABEL_COLUMN_GUESSES, "label", "--label-column", path)
    key_col = _pick_column(columns, key_column, (), "key", "--key-column", path)
    kind, exts, sizes, names = None, set(), [0] * table.num_rows, [""] * table.num_rows
    if image_col:
        kind = _image_kind(table, image_col, path)
        sizes, exts, names = _scan_images(table, image_col, kind, path, storage)
    labels: list[int | None] = [None] * table.num_rows
    given_names = label_names
    label_names = None
    if label_col:
        labels, label_names = to_labels(table.column(label_col).to_pylist(), path, label_col, given_names)
    if key_col:
        keys = _keys(table.column(key_col).to_pylist(), table.num_rows, path, key_col)
    elif key == "path" and any(names):
        keys = path_keys([n or f"row-{i}" for i, n in enumerate(names)])
    else:
        keys = _keys(None, table.num_rows, path, None)
    extra = tuple(c for c in columns if c not in (image_col, label_col, key_col))
    extra_fields = tuple(Field(name=c, type=_field_type(table.schema.field(c).type)) for c in extra)
    json_bytes = 64 if extra else 0
    refs = [Ref(keys[i], labels[i], i, sizes[i] + json_bytes, 2 + bool(extra)) for i in range(table.num_rows)]
    return TableSource(
        description=description or path, refs=refs, label_names=label_names or _hf_label_names(table, label_col),
        image_exts=tuple(sorted(exts)), extra_fields=extra_fields, has_labels=label_col is not None, path=path,
        image_column=image_col, image_kind=kind, extra_columns=extra, storage=storage,
        paths=paths if len(paths) > 1 else (), _table=table,
    )


def _hf_label_names(table: Any, column: str | None) -> tuple[str, ...] | None:
    """Class names a Hugging Face export keeps in its schema metadata (a ClassLabel feature)."""
    import json

    meta = (table.schema.metadata or {}).get(b"huggingface")
    if not column or not meta:
        return None
    try:
        feature = json.loads(meta)["info"]["features"][column]
        names = feature.get("names") if isinstance(feature, dict) else None
    except (ValueError, KeyError, TypeError):
        return None
    return tuple(str(n) for n in names) if isinstance(names, list) and names else None


_BAD_KEY = re.compile(r"[.\s\\]|^/|/$|//")


def _keys(values: list[Any] | None, n: int, path: str, column: str | None) -> list[str]:
    if values is None:
        width = key_width(n)
        return [f"{i:0{width}d}" for i in range(n)]
    keys = [str(v) for v in values]
    for k in keys:
        if not k or _BAD_KEY.search(k):
            raise SourceError(
                f"{path}: key {k!r} in column {column!r} is not usable as a WebDataset key (no dots, spaces "
                "or backslashes; WebDataset splits KEY.EXT at the first dot); pick another --key-column, "
                "or use --key path"
            )
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise SourceError(f"{path}: key {dup!r} appears more than once in column {column!r}; keys must be unique")
    return keys
