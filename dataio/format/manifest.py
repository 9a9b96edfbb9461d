"""The dataset manifest: versioned JSON, written last and atomically; a prefix without one is no dataset.

Per-shard facts are stored column-wise (one JSON list per field) so that a manifest of 100k
shards stays a few MB and loads in a fraction of a second. Paths are relative and may not
leave the dataset prefix; loading refuses anything else. Checksums are xxh3-64 (xxhash),
hex, over the whole object: fast enough (GB/s) to verify every shard. Version 3 adds checksums
at the granularity workers read (format/checksums.py): a tar shard's per-sample sidecar
("sums_checksum"), a Parquet shard's per-row-group column-chunk checksums
("row_group_checksums"); versions 1 and 2, written before, load without them (unverified).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from dataio.errors import ManifestError, StorageError
from dataio.format.bounds import implausible_shard, max_samples_in
from dataio.format.captions import CaptionsInfo

# checksum_bytes and Checksummer are the manifest's checksum (defined beside the others), imported from here too.
from dataio.format.checksums import Checksummer, checksum_bytes, checksum_column  # noqa: F401
from dataio.format.manifest_parts import (
    PARTS_THRESHOLD,
    Counts,
    PartColumn,
    PartedTable,
    SkippedRows,
    open_root,
    part_paths,
    write_parts,
)
from dataio.format.token_layout import TokensInfo
from dataio.storage.paths import check_relative_many
from dataio.storage.store import Store

MANIFEST_NAME = "manifest.json"
# 3: checksums at the granularity workers read (format/checksums.py); one JSON file holding the
# whole shard table, or past PARTS_THRESHOLD shards a JSON root with "parts" (manifest_parts.py).
# Written before: 1 (one JSON file) and 2 (a parted root), which load unverified.
MANIFEST_VERSION = 3
LEGACY_JSON_VERSION = 1
LEGACY_PARTED_VERSION = 2
READ_VERSIONS = (LEGACY_JSON_VERSION, LEGACY_PARTED_VERSION, MANIFEST_VERSION)
CHECKSUM_ALGORITHM = "xxh3_64"
FORMATS = ("tar", "parquet", "tokens")  # tokens: dataio/format/token_layout.py
FIELD_TYPES = ("image", "int", "float", "str", "json", "bytes", "npy")

_TOP_KEYS = {
    "shardify_manifest", "format", "fields", "num_samples", "num_bytes", "checksum_algorithm",
    "tool_version", "created_utc", "source", "label_names", "skipped", "shards", "tokens",
    "captions",  # image-text pairs (format/captions.py); absent otherwise
}
_ROOT_KEYS = (_TOP_KEYS - {"shards"}) | {"num_shards", "fingerprint", "parts"}
_SHARD_COLUMNS_TAR = ("path", "num_samples", "num_bytes", "checksum", "index_path", "index_bytes", "index_checksum")
_SHARD_COLUMNS_PARQUET = ("path", "num_samples", "num_bytes", "checksum", "row_groups")
# A token shard: samples are documents, its index the document offsets, plus its token count.
_SHARD_COLUMNS_TOKENS = (*_SHARD_COLUMNS_TAR, "num_tokens")
# The column a version-3 manifest adds per format ("" or [] for a shard written without them).
READ_CHECKSUM_COLUMN = {"tar": "sums_checksum", "parquet": "row_group_checksums", "tokens": "sums_checksum"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """One per-sample field: its name (a WebDataset extension or a column) and its type."""

    name: str
    type: str

    def __post_init__(self) -> None:
        if self.type not in FIELD_TYPES:
            raise ValueError(f"field {self.name!r}: type {self.type!r} is not one of {FIELD_TYPES}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardInfo:
    """One shard as the manifest describes it (a row of the column-wise shard table)."""

    path: str
    num_samples: int
    num_bytes: int
    checksum: str
    index_path: str | None = None  # tar: the sample index beside the shard
    index_bytes: int | None = None
    index_checksum: str | None = None
    row_groups: tuple[int, ...] | None = None  # parquet: samples per row group
    sums_checksum: str = ""  # tar: the checksum of its per-sample checksums sidecar ("": none)
    row_group_checksums: tuple[str, ...] = ()  # parquet: per row group, its column chunks' (format/checksums.py)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a dataset holds; `shards` is column-wise: shard i is `shard(i)`."""

    format: str
    fields: tuple[Field, ...]
    shard_paths: tuple[str, ...]
    shard_num_samples: tuple[int, ...]
    shard_num_bytes: tuple[int, ...]
    shard_checksums: tuple[str, ...]
    index_paths: tuple[str, ...] = ()
    index_num_bytes: tuple[int, ...] = ()
    index_checksums: tuple[str, ...] = ()
    row_groups: tuple[tuple[int, ...], ...] = ()
    # Checksums at read granularity (format/checksums.py), one entry per shard ("" / (): that shard
    # has none); the whole column empty: a dataset written before them (manifest version 1 or 2).
    sums_checksums: tuple[str, ...] = ()
    row_group_checksums: tuple[tuple[str, ...], ...] = ()
    tool_version: str = ""
    created_utc: str = ""
    source: str = ""
    label_names: tuple[str, ...] | None = None
    skipped: tuple[dict[str, str], ...] = ()
    shard_num_tokens: tuple[int, ...] = ()  # tokens: per shard, its tokens (EOS included)
    tokens: TokensInfo | None = None  # tokens: format version, dtype, checksum blocks, tokenizer
    captions: CaptionsInfo | None = None  # image-text pairs: which field is the caption (format/captions.py)
    _fingerprint: list[str] = field(default_factory=list, repr=False, compare=False)
    # Set when loaded from a parted root: its fingerprint and totals, and the parts' loader.
    parted: PartedTable | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {FORMATS}")
        n = len(self.shard_paths)
        columns = [self.shard_num_samples, self.shard_num_bytes, self.shard_checksums]
        if self.format in ("tar", "tokens"):
            columns += [self.index_paths, self.index_num_bytes, self.index_checksums]
            if self.format == "tokens":
                columns.append(self.shard_num_tokens)
                if self.tokens is None or len(self.read_checksums) != n:
                    raise ValueError("a token manifest needs its tokens section and a checksum sidecar per shard")
        else:
            columns += [self.row_groups]
        if any(len(c) != n for c in columns):
            raise ValueError("every shard column must have one entry per shard")
        if len(self.read_checksums) not in (0, n):
            raise ValueError(f"{READ_CHECKSUM_COLUMN[self.format]} needs one entry per shard, or none at all")

    @property
    def read_checksums(self) -> Sequence[Any]:
        """The per-shard column of checksums at read granularity for this format (empty: none)."""
        return self.row_group_checksums if self.format == "parquet" else self.sums_checksums

    @property
    def has_read_checksums(self) -> bool:
        """True for a manifest of version 3 (its shards carry per-sample / per-row-group checksums)."""
        return len(self.read_checksums) > 0 or (self.parted is not None and self.parted.with_checksums)

    @property
    def version(self) -> int:
        """The manifest format version this manifest is written as."""
        if self.has_read_checksums:
            return MANIFEST_VERSION
        return LEGACY_JSON_VERSION if self.parted is None else LEGACY_PARTED_VERSION

    @property
    def num_shards(self) -> int:
        return len(self.shard_paths)

    @property
    def num_samples(self) -> int:
        if self.parted is not None:
            return int(self.parted.num_samples.sum())
        return sum(self.shard_num_samples)

    @property
    def num_bytes(self) -> int:
        return self.parted.total_bytes if self.parted is not None else sum(self.shard_num_bytes)

    @property
    def part_paths(self) -> list[str]:
        """The manifest's own files besides manifest.json (Parquet parts), relative to the dataset."""
        return [] if self.parted is None else part_paths(self.parted.parts)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def shard(self, i: int) -> ShardInfo:
        if self.format in ("tar", "tokens"):
            return ShardInfo(
                path=self.shard_paths[i], num_samples=self.shard_num_samples[i],
                num_bytes=self.shard_num_bytes[i], checksum=self.shard_checksums[i],
                index_path=self.index_paths[i], index_bytes=self.index_num_bytes[i],
                index_checksum=self.index_checksums[i],
                sums_checksum=self.sums_checksums[i] if self.sums_checksums else "",
            )
        return ShardInfo(
            path=self.shard_paths[i], num_samples=self.shard_num_samples[i],
            num_bytes=self.shard_num_bytes[i], checksum=self.shard_checksums[i],
            row_groups=self.row_groups[i],
            row_group_checksums=tuple(self.row_group_checksums[i]) if self.row_group_checksums else (),
        )

    @property
    def fingerprint(self) -> str:
        """Identifies the dataset's content: shard paths, sizes and checksums, hashed."""
        if self.parted is not None:
            return self.parted.fingerprint  # computed by the writer: no worker reads every part
        if not self._fingerprint:
            self._fingerprint.append(self.computed_fingerprint())
        return self._fingerprint[0]

    def computed_fingerprint(self) -> str:
        """The fingerprint recomputed from every shard (a parted manifest: reads every part)."""
        h = xxhash.xxh3_64()
        h.update(self.format.encode())
        for path, n, checksum in zip(self.shard_paths, self.shard_num_samples, self.shard_checksums):
            h.update(f"\0{path}\0{n}\0{checksum}".encode())
        return h.hexdigest()

    def _header(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "fields": [{"name": f.name, "type": f.type} for f in self.fields],
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "checksum_algorithm": CHECKSUM_ALGORITHM,
            "tool_version": self.tool_version,
            "created_utc": self.created_utc,
            "source": self.source,
            "label_names": None if self.label_names is None else list(self.label_names),
            "skipped": [dict(s) for s in self.skipped],
            **({"captions": self.captions.to_json()} if self.captions is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        shards: dict[str, Any] = {
            "path": list(self.shard_paths), "num_samples": list(self.shard_num_samples),
            "num_bytes": list(self.shard_num_bytes), "checksum": list(self.shard_checksums),
        }
        if self.format in ("tar", "tokens"):
            shards |= {
                "index_path": list(self.index_paths), "index_bytes": list(self.index_num_bytes),
                "index_checksum": list(self.index_checksums),
            }
        else:
            shards["row_groups"] = [list(r) for r in self.row_groups]
        if self.has_read_checksums:
            column = READ_CHECKSUM_COLUMN[self.format]
            shards[column] = [c if isinstance(c, str) else list(c) for c in self.read_checksums]
            if self.tokens is not None:
                shards["num_tokens"] = list(self.shard_num_tokens)
                return {"shardify_manifest": MANIFEST_VERSION, **self._header(), "tokens": self.tokens.to_json(),
                        "shards": shards}
            return {"shardify_manifest": MANIFEST_VERSION, **self._header(), "shards": shards}
        return {"shardify_manifest": LEGACY_JSON_VERSION, **self._header(), "shards": shards}

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "manifest") -> Manifest:
        """Build and validate a Manifest from parsed JSON; ManifestError names `where` and the fix."""

        def bad(why: str) -> ManifestError:
            return ManifestError(f"{where}: {why}; rewrite the dataset with `shardify write ... --overwrite`")

        if not isinstance(doc, dict) or "shardify_manifest" not in doc:
            raise bad("not a shardify manifest (no 'shardify_manifest' version key)")
        version = doc["shardify_manifest"]
        if version not in READ_VERSIONS or isinstance(version, bool):
            raise ManifestError(
                f"{where}: manifest version {version!r} is not supported by this shardify "
                f"(it reads versions {list(READ_VERSIONS)}); upgrade shardify or rewrite the dataset"
            )
        if is_parted_root(doc):
            raise bad("a parted root loads only with its store: use read_manifest")
        unknown = set(doc) - _TOP_KEYS
        if unknown:
            raise bad(f"unknown keys {sorted(unknown)}")
        if doc.get("checksum_algorithm") != CHECKSUM_ALGORITHM:
            raise bad(f"checksum algorithm {doc.get('checksum_algorithm')!r} is not {CHECKSUM_ALGORITHM!r}")
        fmt = doc.get("format")
        shards = doc.get("shards")
        if fmt not in FORMATS or not isinstance(shards, dict):
            raise bad(f"format must be one of {FORMATS} and 'shards' a table")
        columns = {"tar": _SHARD_COLUMNS_TAR, "parquet": _SHARD_COLUMNS_PARQUET, "tokens": _SHARD_COLUMNS_TOKENS}[fmt]
        if version == MANIFEST_VERSION:
            columns += (READ_CHECKSUM_COLUMN[fmt],)
        missing = [c for c in columns if not isinstance(shards.get(c), list)]
        if missing:
            raise bad(f"shard columns {missing} are missing")
        try:
            for column in ("path", "index_path") if fmt != "parquet" else ("path",):
                check_relative_many(shards[column])
        except (ValueError, TypeError) as exc:
            raise bad(f"unsafe shard path: {exc}") from None
        try:
            manifest = cls(
                format=fmt,
                fields=tuple(Field(name=f["name"], type=f["type"]) for f in doc.get("fields", [])),
                shard_paths=tuple(shards["path"]),
                shard_num_samples=tuple(int(n) for n in shards["num_samples"]),
                shard_num_bytes=tuple(int(n) for n in shards["num_bytes"]),
                shard_checksums=tuple(shards["checksum"]),
                index_paths=tuple(shards.get("index_path", ())),
                index_num_bytes=tuple(int(n) for n in shards.get("index_bytes", ())),
                index_checksums=tuple(shards.get("index_checksum", ())),
                row_groups=tuple(tuple(int(n) for n in r) for r in shards.get("row_groups", ())),
                **checksum_column(fmt, shards.get(READ_CHECKSUM_COLUMN[fmt]) if version == MANIFEST_VERSION else None),
                tool_version=str(doc.get("tool_version", "")),
                created_utc=str(doc.get("created_utc", "")),
                source=str(doc.get("source", "")),
                label_names=None if doc.get("label_names") is None else tuple(doc["label_names"]),
                skipped=tuple(dict(s) for s in doc.get("skipped", [])),
                shard_num_tokens=tuple(int(n) for n in shards.get("num_tokens", ())) if fmt == "tokens" else (),
                tokens=TokensInfo.from_json(doc["tokens"], where=where) if fmt == "tokens" else None,
                captions=_captions(doc, where),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"malformed: {exc}") from None
        if any(n < 0 for n in manifest.shard_num_samples) or any(n < 0 for n in manifest.shard_num_bytes):
            raise bad("negative shard sizes")
        implausible = implausible_shard(manifest)
        if implausible is not None:
            raise bad(implausible)
        if doc.get("num_samples") != manifest.num_samples:
            raise bad(f"num_samples {doc.get('num_samples')} != sum over shards {manifest.num_samples}")
        if fmt == "parquet" and any(sum(r) != n for r, n in zip(manifest.row_groups, manifest.shard_num_samples)):
            raise bad("row-group sizes do not add up to shard sample counts")
        if any(c and len(c) != len(r) for c, r in zip(manifest.row_group_checksums, manifest.row_groups)):
            raise bad("row_group_checksums do not list one entry per row group")
        return manifest


def read_manifest(store: Store) -> Manifest:
    """Load and validate the manifest at the store's prefix (either form); ManifestError if absent or wrong.

    A parted manifest loads its root and the sizes part only; the rest of the shard table is
    fetched part by part as shards in it are used (`manifest_parts.PartedTable`).
    """
    where = store.url_of(MANIFEST_NAME)
    try:
        raw = store.read(MANIFEST_NAME)
    except StorageError as exc:
        if exc.not_found:
            raise ManifestError(
                f"{where} does not exist: {store.url} is not a shardify dataset (or its writing "
                "never finished); create it with `shardify write SRC DEST`, or, if it already holds "
                f"Parquet files (a Hugging Face export, say), index them in place with `shardify index {store.url}`"
            ) from exc
        raise
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(
            f"{where} is not valid JSON ({exc}); the dataset is damaged: rewrite it with "
            "`shardify write ... --overwrite`"
        ) from None
    if isinstance(doc, dict) and is_parted_root(doc):
        return _from_root(store, doc, where)
    return Manifest.from_json(doc, where=where)


def _from_root(store: Store, doc: dict[str, Any], where: str) -> Manifest:
    """A Manifest over a parted root: counts in memory, the other columns loaded part by part."""
    if doc.get("checksum_algorithm") != CHECKSUM_ALGORITHM:
        raise ManifestError(f"{where}: checksum algorithm {doc.get('checksum_algorithm')!r} is not "
                            f"{CHECKSUM_ALGORITHM!r}; rewrite the dataset with `shardify write ... --overwrite`")
    table = open_root(store, doc, where, allowed_keys=_ROOT_KEYS | {"shardify_manifest"}, formats=FORMATS,
                      with_checksums=doc["shardify_manifest"] == MANIFEST_VERSION)
    # Per-shard bytes live in the table parts (read when used): bound the totals and the largest
    # shard here; each shard's own bound and real size are checked when a reader opens it.
    sizes, most = table.num_samples, max_samples_in(table.fmt, table.total_bytes)
    if doc["num_samples"] > most or (len(sizes) and int(sizes.max()) > most):
        raise ManifestError(
            f"{where}: {doc['num_samples']} samples (largest shard {int(sizes.max()) if len(sizes) else 0}) cannot "
            f"fit in {doc['num_bytes']} bytes (at most {most}): the manifest is forged or corrupt; rewrite the "
            "dataset with `shardify write ... --overwrite`")
    col = {name: PartColumn(table, name) for name in table.column_names}
    skipped = SkippedRows(table) if "skipped" in table.parts else tuple(doc.get("skipped", []))
    try:
        return Manifest(
            format=table.fmt,
            fields=tuple(Field(name=f["name"], type=f["type"]) for f in doc.get("fields", [])),
            shard_paths=col["path"], shard_num_samples=Counts(table.num_samples),  # type: ignore[arg-type]
            shard_num_bytes=col["num_bytes"], shard_checksums=col["checksum"],  # type: ignore[arg-type]
            index_paths=col.get("index_path", ()), index_num_bytes=col.get("index_bytes", ()),  # type: ignore[arg-type]
            index_checksums=col.get("index_checksum", ()), row_groups=col.get("row_groups", ()),  # type: ignore[arg-type]
            sums_checksums=col.get("sums_checksum", ()),  # type: ignore[arg-type]
            row_group_checksums=col.get("row_group_checksums", ()),  # type: ignore[arg-type]
            tool_version=str(doc.get("tool_version", "")), created_utc=str(doc.get("created_utc", "")),
            source=str(doc.get("source", "")),
            label_names=None if doc.get("label_names") is None else tuple(doc["label_names"]),
            skipped=skipped, parted=table, captions=_captions(doc, where),  # type: ignore[arg-type]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{where}: malformed: {exc}; rewrite the dataset with `shardify write ... --overwrite`") from None


def _captions(doc: dict[str, Any], where: str) -> CaptionsInfo | None:
    return CaptionsInfo.from_json(doc["captions"], where=where) if doc.get("captions") is not None else None


def write_manifest(store: Store, manifest: Manifest, *, parts_threshold: int = PARTS_THRESHOLD) -> None:
    """Publish the manifest atomically; call it only after every shard it lists is published.

    Up to `parts_threshold` shards: one JSON file. Past it: the Parquet parts first (each
    atomically, in a directory named by the fingerprint), then the small JSON root, last.
    """
    if manifest.num_shards <= parts_threshold or manifest.format == "tokens":  # tokens: no parted form yet
        store.write_bytes(MANIFEST_NAME, manifest.dumps())
        return
    parts = write_parts(store, manifest)
    version = MANIFEST_VERSION if manifest.has_read_checksums else LEGACY_PARTED_VERSION
    root = {"shardify_manifest": version, **manifest._header(), "num_shards": manifest.num_shards,
            "fingerprint": manifest.fingerprint, "parts": parts, "skipped": []}  # skipped: in their own part
    store.write_bytes(MANIFEST_NAME, json.dumps(root, separators=(",", ":")).encode())


def is_parted_root(doc: dict[str, Any]) -> bool:
    """A parted root (version 2, or version 3 with "parts"), not a whole JSON manifest."""
    version = doc.get("shardify_manifest")
    return version == LEGACY_PARTED_VERSION or (version == MANIFEST_VERSION and "parts" in doc)


def label_field(manifest: Manifest) -> str:
    """The field batch["label"] comes from: `cls`, else an integer column named `label` (Hugging Face)."""
    types = {f.name: f.type for f in manifest.fields}
    return "label" if "cls" not in types and types.get("label") == "int" else "cls"


def label_histogram(labels: Sequence[int]) -> dict[int, int]:
    """Counts per label, sorted by label."""
    counts: dict[int, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return dict(sorted(counts.items()))
