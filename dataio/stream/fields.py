"""Every non-image field of a sample into the batch: text and JSON as lists, numbers as tensors,
raw bytes as PackedBytes.

A field's kind comes from its manifest type (`str`, `json`, `int`, `float`, `bytes`, `npy`), and
for tar members typed as plain bytes from WebDataset's extension conventions (`txt` is text,
`json` is JSON, `cls2` a number). JSON is parsed with `json.loads`, never unpickled: no field of
a dataset can run code in the loader. A leaf of the loader package (config's floor).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from dataio.decode.images import IMAGE_EXTS
from dataio.format.manifest import Manifest, label_field

TEXT_EXTS = ("txt", "text", "caption", "transcript", "md", "html", "csv", "tsv")
JSON_EXTS = ("json", "jsn")
NUMBER_EXTS = ("cls", "cls2", "index", "num", "id")
KINDS = ("image", "number", "text", "json", "bytes")
BYTES_LIKE = (bytes, bytearray, memoryview)


class FieldError(ValueError):
    """One sample's field cannot be read as its kind (bad UTF-8, JSON, number): names the field."""


def batch_fields(manifest: Manifest, fields: tuple[str, ...] | None, image_fields: tuple[str, ...],
                 decoded: bool) -> tuple[str, ...]:
    """The fields every default batch of one dataset carries, whether or not its samples hold them
    (a batch whose samples all lack one gets None / empty items, never a missing key): the read
    fields but the label, and the image fields too unless images are decoded."""
    label = label_field(manifest)
    return tuple(f.name for f in manifest.fields if (fields is None or f.name in fields) and f.name != label
                 and not (decoded and f.name in image_fields))


def kind_of(name: str, field_type: str | None) -> str:
    """How a field reaches the batch, from its manifest type, else its (WebDataset) extension."""
    if field_type == "image":
        return "image"
    if field_type in ("int", "float"):
        return "number"
    if field_type == "str":
        return "text"
    if field_type == "json":
        return "json"
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in IMAGE_EXTS:
        return "image"
    if ext in TEXT_EXTS:
        return "text"
    if ext in JSON_EXTS:
        return "json"
    if ext in NUMBER_EXTS:
        return "number"
    return "bytes"  # bytes, npy (np.load(io.BytesIO(b), allow_pickle=False)), anything unknown


def field_kinds(manifest: Manifest) -> dict[str, str]:
    """Kind of every field the manifest names; fields it does not name are judged by extension."""
    return {f.name: kind_of(f.name, f.type) for f in manifest.fields}


def parse_value(kind: str, value: Any, name: str) -> Any:
    """One present value as its kind's Python value; FieldError says why it cannot be."""
    if kind == "text":
        if isinstance(value, BYTES_LIKE):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FieldError(f"field {name!r} is not UTF-8 text ({exc})") from None
        return value
    if kind == "json":
        if isinstance(value, (str, *BYTES_LIKE)):
            try:
                return json.loads(bytes(value) if not isinstance(value, str) else value)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise FieldError(f"field {name!r} is not valid JSON ({exc})") from None
        return value  # a nested Parquet column: already Python lists and dicts
    if kind == "number" and isinstance(value, BYTES_LIKE):
        text = bytes(value).strip()
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                raise FieldError(f"field {name!r} holds {bytes(value)[:20]!r}, not a number") from None
    return value


def collate_values(kind: str, values: list[Any], pack: Any) -> Any:
    """One field over a batch (None where a sample lacks it): its batch column.

    bytes and raw images -> PackedBytes (an absent value is an empty item); numbers -> an int64,
    float64 or bool tensor when every sample has one, else a list; text and JSON -> lists.
    """
    if kind in ("bytes", "image"):
        if all(isinstance(v, BYTES_LIKE) or v is None for v in values):
            return pack([b"" if v is None else v for v in values])
        return values
    if kind == "number" and all(v is not None for v in values):
        if all(isinstance(v, (bool, np.bool_)) for v in values):
            return torch.tensor(values, dtype=torch.bool)
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in values):
            return torch.tensor([int(v) for v in values], dtype=torch.int64)
        if all(isinstance(v, (float, int, np.floating, np.integer)) for v in values):
            return torch.tensor([float(v) for v in values], dtype=torch.float64)
    return list(values)
