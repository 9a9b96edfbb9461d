"""The manifest's "captions" section: which field of an image-text pair dataset holds the caption.

A pair dataset is a tar (or Parquet) dataset whose samples carry an image and a caption: the
caption field (`txt`, as img2dataset writes it) holds the first caption as UTF-8 text, and a
sample with several captions lists them all under `list_key` of its `json` field. Stock readers
(webdataset, open_clip) see `txt` as they expect; shardify's loader samples one per epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CAPTION_FIELD = "txt"  # img2dataset's and open_clip's caption member
CAPTION_LIST_KEY = "captions"  # in the sample's json: every caption of the sample, the first one included


@dataclass(frozen=True, kw_only=True, slots=True)
class CaptionsInfo:
    """Which field is the caption, and under which key of the json field its alternatives are listed."""

    field: str = CAPTION_FIELD
    list_key: str = CAPTION_LIST_KEY
    # The captions' tokenizer, when the write was given one (`--tokenizer FILE`): its file, stored in the
    # dataset's prefix at this relative path (tokenizers/<hash>/<name>), and "xxh3_64:<hex>" of its bytes.
    tokenizer: str = ""
    tokenizer_hash: str = ""

    def __post_init__(self) -> None:
        for name in ("field", "list_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"captions {name} must be a non-empty string, got {value!r}")
        if bool(self.tokenizer) != bool(self.tokenizer_hash) or self.tokenizer.startswith("/") or ".." in self.tokenizer:
            raise ValueError(f"captions tokenizer must be a path inside the dataset with its hash, got "
                             f"{self.tokenizer!r} ({self.tokenizer_hash!r})")

    def to_json(self) -> dict[str, Any]:
        named = {"tokenizer": self.tokenizer, "tokenizer_hash": self.tokenizer_hash} if self.tokenizer else {}
        return {"field": self.field, "list_key": self.list_key, **named}

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "manifest") -> CaptionsInfo:
        if not isinstance(doc, Mapping) or set(doc) - {"field", "list_key", "tokenizer", "tokenizer_hash"}:
            raise ValueError(f"{where}: 'captions' must be {{'field': NAME, 'list_key': KEY}} (+ 'tokenizer', "
                             f"'tokenizer_hash'), got {doc!r}")
        return cls(field=str(doc.get("field", CAPTION_FIELD)), list_key=str(doc.get("list_key", CAPTION_LIST_KEY)),
                   tokenizer=str(doc.get("tokenizer", "")), tokenizer_hash=str(doc.get("tokenizer_hash", "")))
