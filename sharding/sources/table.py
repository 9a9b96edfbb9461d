"""A table source: CSV, JSONL or Parquet rows whose columns hold image paths or bytes, labels, keys, values."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataio.errors import ShardifyError
from dataio.format.manifest import Field
from sharding.sources.base import (
    RawSample,
    Ref,
    Source,
    SourceError,
    key_width,
    normalize_ext,
    read_file,
)

_IMAGE_COLUMN_GUESSES = ("image", "img", "image_path", "path", "file", "filename", "filepath", "jpg", "png")
_LABEL_COLUMN_GUESSES = ("label", "cls", "class", "target", "category")


def _read_table(path: str) -> Any:
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    lower = path.lower()
    try:
        if lower.endswith(".csv"):
            return pcsv.read_csv(path)
        if lower.endswith((".jsonl", ".ndjson")):
            return pjson.read_json(path)
        return pq.read_table(path, memory_map=True)
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


@dataclass(kw_only=True)
class TableSource(Source):
    path: str
    image_column: str | None
    image_is_bytes: bool
    extra_columns: tuple[str, ...]
    _table: Any = field(default=None, repr=False)

    def _rows(self, rows: list[int]) -> list[dict[str, Any]]:
        if self._table is None:
            self._table = _read_table(self.path)
        columns = [c for c in (self.image_column, *self.extra_columns) if c]
        return self._table.select(columns).take(rows).to_pylist()

    def load(self, refs: Sequence[Ref]) -> Iterator[tuple[Ref, RawSample | Exception]]:
        base = os.path.dirname(os.path.abspath(self.path))
        for ref, row in zip(refs, self._rows([r.loc for r in refs])):
            where = f"{self.path} row {ref.loc}"
            image, ext = None, None
            if self.image_column:
                value = row[self.image_column]
                if value is None:
                    yield ref, SourceError(f"{where}: column {self.image_column!r} is empty")
                    continue
                if self.image_is_bytes:
                    image, ext = bytes(value), self.image_exts[0]
                else:
                    where = os.path.join(base, str(value))
                    try:
                        image = read_file(where)
                    except OSError as exc:
                        yield ref, SourceError(f"{where} (row {ref.loc}): cannot read ({exc.strerror or exc})")
                        continue
                    ext = normalize_ext(os.path.splitext(str(value))[1]) or "jpg"
            extras = {c: row[c] for c in self.extra_columns}
            yield ref, RawSample(ref.key, ref.label, ext, image, extras, where)


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


def _labels(values: list[Any], path: str, column: str) -> tuple[list[int | None], tuple[str, ...] | None]:
    """Integer labels as they are; anything else mapped to the index of its sorted distinct names."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        if any(v < 0 for v in present):
            raise SourceError(f"{path}: column {column!r} holds negative labels; labels must be >= 0")
        return values, None
    names = tuple(sorted({str(v) for v in present}))
    index = {n: i for i, n in enumerate(names)}
    return [None if v is None else index[str(v)] for v in values], names


def _image_ext_of_bytes(values: list[Any]) -> str:
    from dataio.decode.images import probe

    for v in values:
        if v:
            try:
                return normalize_ext(probe(bytes(v))[0] or "jpg")
            except ShardifyError:
                continue
    return "jpg"


def open_table(path: str, *, image_column: str | None, label_column: str | None, key_column: str | None) -> TableSource:
    """A CSV/JSONL/Parquet table; the image column holds paths (relative to the table) or bytes."""
    table = _read_table(path)
    columns = list(table.column_names)
    if table.num_rows == 0:
        raise SourceError(f"{path}: the table has no rows; nothing to write")
    image_col = _pick_column(columns, image_column, _IMAGE_COLUMN_GUESSES, "image", "--image-column", path)
    label_col = _pick_column(columns, label_column, _LABEL_COLUMN_GUESSES, "label", "--label-column", path)
    key_col = _pick_column(columns, key_column, (), "key", "--key-column", path)
    image_is_bytes = False
    exts: tuple[str, ...] = ()
    sizes = [0] * table.num_rows
    if image_col:
        image_type = _field_type(table.schema.field(image_col).type)
        image_is_bytes = image_type == "bytes"
        values = table.column(image_col).to_pylist()
        if image_is_bytes:
            exts = (_image_ext_of_bytes(values),)
            sizes = [len(v or b"") for v in values]
        elif image_type == "str":
            base = os.path.dirname(os.path.abspath(path))
            exts = tuple(sorted({normalize_ext(os.path.splitext(str(v))[1]) or "jpg" for v in values if v}))
            sizes = [_size_or_zero(os.path.join(base, str(v))) if v else 0 for v in values]
        else:
            raise SourceError(f"{path}: image column {image_col!r} holds {image_type}, not file paths or bytes")
    labels: list[int | None] = [None] * table.num_rows
    label_names = None
    if label_col:
        labels, label_names = _labels(table.column(label_col).to_pylist(), path, label_col)
    keys = _keys(table.column(key_col).to_pylist() if key_col else None, table.num_rows, path, key_col)
    extra = tuple(c for c in columns if c not in (image_col, label_col, key_col))
    extra_fields = tuple(Field(name=c, type=_field_type(table.schema.field(c).type)) for c in extra)
    json_bytes = 64 if extra else 0
    refs = [Ref(keys[i], labels[i], i, sizes[i] + json_bytes, 2 + bool(extra)) for i in range(table.num_rows)]
    return TableSource(
        description=path, refs=refs, label_names=label_names, image_exts=exts, extra_fields=extra_fields,
        has_labels=label_col is not None, path=path, image_column=image_col, image_is_bytes=image_is_bytes,
        extra_columns=extra, _table=table,
    )


def _size_or_zero(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


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
                "or backslashes; WebDataset splits KEY.EXT at the first dot); pick another --key-column"
            )
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise SourceError(f"{path}: key {dup!r} appears more than once in column {column!r}; keys must be unique")
    return keys

