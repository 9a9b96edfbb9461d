"""The columnar form of a big manifest: a small JSON root, then Parquet parts read only in part.

Past `PARTS_THRESHOLD` shards one JSON file is too big for every loader to fetch and parse (2M
shards: ~400 MB of JSON). The root (manifest.json, written last) keeps the totals, the
fingerprint and the list of parts, each with its byte size and checksum; the parts live in a
directory named by the fingerprint, so a newer version never overwrites a part an older root
still lists:

    manifest.parts/<fingerprint>/sizes.parquet         every shard's sample count: the plan's
                                                       one column, read whole (~1-4 MB at 2M shards)
    manifest.parts/<fingerprint>/part-000000.parquet   rows [k*R, (k+1)*R) of the rest of the
                                                       shard table, read only when a shard in it is

Every part is read whole and checked against the root's size and checksum; its Parquet metadata
names the fingerprint and its number, so a root listing another version's part fails naming it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from dataio.errors import ManifestError, StorageError
from dataio.storage.paths import check_relative, check_relative_many
from dataio.storage.store import Store

PARTS_THRESHOLD = 10_000  # shards: above this, write_manifest writes the columnar form
ROWS_PER_PART = 4096  # one part is ~0.2-0.4 MB: a worker fetches the few holding its shards
PARTS_DIR = "manifest.parts"
CACHED_PARTS = 16  # table parts kept decoded per process (~1.5 MB each)
_META_KEY = b"shardify_part"

# The shard table's columns besides the sample counts, per format, with their Arrow types; the
# last is the read-granularity checksums of manifest version 3 (absent from a version-2 table).
TABLE_COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "tar": {"path": pa.string(), "num_bytes": pa.int64(), "checksum": pa.string(),
            "index_path": pa.string(), "index_bytes": pa.int64(), "index_checksum": pa.string(),
            "sums_checksum": pa.string()},
    "parquet": {"path": pa.string(), "num_bytes": pa.int64(), "checksum": pa.string(),
                "row_groups": pa.list_(pa.int64()), "row_group_checksums": pa.list_(pa.string())},
}
_PATH_COLUMNS = ("path", "index_path")


def table_columns(fmt: str, with_checksums: bool) -> dict[str, pa.DataType]:
    """The table parts' columns of a version-3 root (with_checksums) or a version-2 one."""
    columns = dict(TABLE_COLUMNS[fmt])
    if not with_checksums:
        columns.popitem()
    return columns


def _checksum(data: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def _parquet_bytes(table: pa.Table, fingerprint: str, part: str) -> bytes:
    import pyarrow.parquet as pq  # here, not at the top: every trainer rank and loader imports this module

    meta = {_META_KEY: f"{fingerprint}/{part}".encode()}
    table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    # Counts vary little from shard to shard: delta encoding packs 2M of them into ~1-2 MB.
    encodings = {"num_samples": "DELTA_BINARY_PACKED"} if "num_samples" in table.column_names else None
    pq.write_table(table, sink, compression="zstd", use_dictionary=encodings is None,
                   column_encoding=encodings, write_statistics=False)
    return sink.getvalue().to_pybytes()


def _columns(manifest: Any) -> dict[str, Sequence[Any]]:
    columns = {"path": manifest.shard_paths, "num_bytes": manifest.shard_num_bytes, "checksum": manifest.shard_checksums}
    if manifest.format == "tar":
        columns |= {"index_path": manifest.index_paths, "index_bytes": manifest.index_num_bytes,
                    "index_checksum": manifest.index_checksums, "sums_checksum": manifest.sums_checksums}
    else:
        columns |= {"row_groups": manifest.row_groups, "row_group_checksums": manifest.row_group_checksums}
    return columns


def write_parts(store: Store, manifest: Any, *, rows_per_part: int | None = None, num_threads: int = 16) -> dict[str, Any]:
    """Write a Manifest's sizes, table and skipped parts (each atomically); return the root's "parts" entry.

    Call before publishing the root: the root is what makes them a dataset version.
    """
    fingerprint, num_samples, columns = manifest.fingerprint, manifest.shard_num_samples, _columns(manifest)
    names = table_columns(manifest.format, manifest.has_read_checksums)
    rows_per_part = rows_per_part or ROWS_PER_PART
    num_shards = len(num_samples)
    directory = f"{PARTS_DIR}/{fingerprint}"

    def publish(name: str, table: pa.Table) -> dict[str, Any]:
        data = _parquet_bytes(table, fingerprint, name)
        store.write_bytes(f"{directory}/{name}", data)
        return {"path": name, "rows": table.num_rows, "num_bytes": len(data), "checksum": _checksum(data)}

    def table_part(k: int) -> dict[str, Any]:
        lo, hi = k * rows_per_part, min(num_shards, (k + 1) * rows_per_part)
        arrays = [pa.array(list(columns[c][lo:hi]), type=t) for c, t in names.items()]
        return publish(f"part-{k:06d}.parquet", pa.Table.from_arrays(arrays, names=list(names)))

    sizes = pa.table({"num_samples": pa.array(np.asarray(num_samples, dtype=np.int64))})
    num_parts = -(-num_shards // rows_per_part)
    with ThreadPoolExecutor(max(1, num_threads)) as pool:  # uploads overlap; local writes are quick anyway
        tables = list(pool.map(table_part, range(num_parts)))
    out = {"dir": directory, "rows_per_part": rows_per_part, "sizes": publish("sizes.parquet", sizes), "tables": tables}
    if manifest.skipped:  # millions of skipped samples would swell the root: they get a part of their own
        out["skipped"] = publish("skipped.parquet", pa.Table.from_pylist([dict(s) for s in manifest.skipped]))
    return out


def part_paths(parts: dict[str, Any]) -> list[str]:
    """Every file a root's "parts" entry references, relative to the dataset (for gc and checks)."""
    entries = [parts["sizes"], *parts["tables"], *([parts["skipped"]] if "skipped" in parts else [])]
    return [f"{parts['dir']}/{p['path']}" for p in entries]


class PartedTable:
    """The shard table of a parted manifest: loads a part on first use of one of its rows.

    Picklable: a copy carries no decoded parts, so each loader worker fetches only its own.
    """

    def __init__(self, store: Store, parts: dict[str, Any], *, fmt: str, fingerprint: str,
                 num_samples: np.ndarray, total_bytes: int, with_checksums: bool = True) -> None:
        self.store, self.parts, self.fmt, self.fingerprint = store, parts, fmt, fingerprint
        self.num_samples, self.total_bytes, self.with_checksums = num_samples, total_bytes, with_checksums
        self.column_names = tuple(table_columns(fmt, with_checksums))
        self.rows_per_part = int(parts["rows_per_part"])
        self._cache: OrderedDict[int, dict[str, list[Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "parts": self.parts, "fmt": self.fmt, "fingerprint": self.fingerprint,
                "num_samples": self.num_samples, "total_bytes": self.total_bytes,
                "with_checksums": self.with_checksums}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("store"), state.pop("parts"), **state)  # type: ignore[misc]

    def value(self, column: str, row: int) -> Any:
        k, j = divmod(row, self.rows_per_part)
        return self.part(k)[column][j]

    def part(self, k: int) -> dict[str, list[Any]]:
        """Table part k, decoded into one Python list per column (cached, least recently used out)."""
        with self._lock:
            found = self._cache.get(k)
            if found is not None:
                self._cache.move_to_end(k)
                return found
        loaded = self._load(k)
        with self._lock:
            self._cache[k] = loaded
            while len(self._cache) > CACHED_PARTS:
                self._cache.popitem(last=False)
        return loaded

    def _load(self, k: int) -> dict[str, list[Any]]:
        entry = self.parts["tables"][k]
        table, where = read_part(self.store, self.parts, entry, self.fingerprint)
        lo = k * self.rows_per_part
        want = min(self.rows_per_part, len(self.num_samples) - lo)
        if table.num_rows != want or table.column_names != list(self.column_names):
            raise ManifestError(f"{where}: holds {table.num_rows} rows of columns {table.column_names}, the root "
                                f"expects {want} of {list(self.column_names)}; {_FIX}")
        out = {c: table.column(c).to_pylist() for c in table.column_names}
        try:
            for c in _PATH_COLUMNS:
                if c in out:
                    check_relative_many(out[c])
        except (ValueError, TypeError) as exc:
            raise ManifestError(f"{where}: unsafe shard path: {exc}; {_FIX}") from None
        if self.fmt == "parquet":
            out["row_groups"] = [tuple(r) for r in out["row_groups"]]
            if "row_group_checksums" in out:
                out["row_group_checksums"] = [tuple(r) for r in out["row_group_checksums"]]
            counts = self.num_samples[lo:lo + want].tolist()
            if any(sum(r) != n for r, n in zip(out["row_groups"], counts)):
                raise ManifestError(f"{where}: row-group sizes do not add up to the shards' sample counts; {_FIX}")
        if any(n < 0 for n in out["num_bytes"]):
            raise ManifestError(f"{where}: negative shard sizes; {_FIX}")
        return out

    def __len__(self) -> int:
        return len(self.num_samples)


_FIX = "rewrite the dataset with `shardify write ... --overwrite`"


def read_part(store: Store, parts: dict[str, Any], entry: dict[str, Any], fingerprint: str) -> tuple[pa.Table, str]:
    """One part, whole, checked against the root's size and checksum and against the root's version."""
    import pyarrow.parquet as pq  # only datasets with a parted manifest read here (0.15 s of imports)

    rel = f"{parts['dir']}/{entry['path']}"
    where = store.url_of(rel)
    try:
        data = store.read(rel)
    except StorageError as exc:
        if exc.not_found:
            raise ManifestError(f"manifest part {where} is missing (the root lists it); {_FIX}") from None
        raise
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        tag = (pf.schema_arrow.metadata or {}).get(_META_KEY, b"").decode()
    except (pa.ArrowException, OSError, UnicodeDecodeError):
        pf, tag = None, ""
    if pf is not None and tag and tag != f"{fingerprint}/{entry['path']}":
        raise ManifestError(f"manifest part {where} belongs to another dataset version ({tag}), the root is "
                            f"{fingerprint}: the root and its parts do not match; {_FIX}")
    if len(data) != entry["num_bytes"] or _checksum(data) != entry["checksum"]:
        raise ManifestError(f"manifest part {where}: {len(data)} bytes with checksum {_checksum(data)}, the root "
                            f"says {entry['num_bytes']} bytes and {entry['checksum']}: damaged or replaced; {_FIX}")
    assert pf is not None  # the checksum matched what the writer produced
    return pf.read(use_threads=False), where


def check_parts_entry(parts: Any, fingerprint: str) -> None:
    """ValueError unless a root's "parts" entry has the expected shape and stays inside the dataset."""
    if not isinstance(parts, dict) or not isinstance(parts.get("tables"), list) or not isinstance(parts.get("sizes"), dict):
        raise ValueError("'parts' must hold 'sizes' and a list of 'tables'")
    if parts.get("dir") != f"{PARTS_DIR}/{fingerprint}":
        raise ValueError(f"parts directory {parts.get('dir')!r} is not {PARTS_DIR}/{fingerprint}")
    if not isinstance(parts.get("rows_per_part"), int) or parts["rows_per_part"] < 1:
        raise ValueError("'rows_per_part' must be a positive int")
    for entry in [parts["sizes"], *parts["tables"], *([parts["skipped"]] if "skipped" in parts else [])]:
        if not isinstance(entry, dict) or not {"path", "num_bytes", "checksum"} <= set(entry):
            raise ValueError(f"part entry {entry!r} needs path, num_bytes and checksum")
        if "/" in str(entry["path"]):
            raise ValueError(f"part path {entry['path']!r} must be a plain file name")
    check_relative(parts["dir"])


def open_root(store: Store, doc: dict[str, Any], where: str, *, allowed_keys: set[str],
              formats: Sequence[str], with_checksums: bool) -> PartedTable:
    """Check a parted root's own fields, load its sizes part; ManifestError naming `where` or the part."""

    def bad(why: str) -> ManifestError:
        return ManifestError(f"{where}: {why}; {_FIX}")

    unknown = set(doc) - allowed_keys
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}")
    fmt, fingerprint, num_shards = doc.get("format"), doc.get("fingerprint"), doc.get("num_shards")
    if fmt not in formats or not isinstance(fingerprint, str) or not isinstance(num_shards, int) or num_shards < 0:
        raise bad(f"format must be one of {tuple(formats)}, with a fingerprint and num_shards")
    if not isinstance(doc.get("num_bytes"), int) or not isinstance(doc.get("num_samples"), int):
        raise bad("num_samples and num_bytes must be integers")
    try:
        check_parts_entry(doc.get("parts"), fingerprint)
    except (ValueError, TypeError) as exc:
        raise bad(f"bad parts list: {exc}") from None
    sizes = load_sizes(store, doc["parts"], fingerprint, num_shards)
    if int(sizes.sum()) != doc["num_samples"]:
        raise bad(f"num_samples {doc['num_samples']} != sum over shards {int(sizes.sum())}")
    return PartedTable(store, doc["parts"], fmt=fmt, fingerprint=fingerprint, num_samples=sizes,
                       total_bytes=doc["num_bytes"], with_checksums=with_checksums)


def load_sizes(store: Store, parts: dict[str, Any], fingerprint: str, num_shards: int) -> np.ndarray:
    """(num_shards,) int64 sample counts from the sizes part; ManifestError naming the part if wrong."""
    table, where = read_part(store, parts, parts["sizes"], fingerprint)
    if table.column_names != ["num_samples"] or table.num_rows != num_shards:
        raise ManifestError(f"{where}: expected {num_shards} sample counts, found {table.num_rows} rows of "
                            f"{table.column_names}; {_FIX}")
    expected_parts = -(-num_shards // int(parts["rows_per_part"]))
    if len(parts["tables"]) != expected_parts:
        raise ManifestError(f"{store.url}: the root lists {len(parts['tables'])} table parts, {num_shards} shards "
                            f"need {expected_parts}; {_FIX}")
    sizes = table.column("num_samples").to_numpy().astype(np.int64, copy=False)
    if (sizes < 0).any():
        raise ManifestError(f"{where}: negative shard sizes; {_FIX}")
    return sizes


class PartColumn(Sequence[Any]):
    """One column of a PartedTable as a read-only sequence; item i loads only the part holding it."""

    def __init__(self, table: PartedTable, name: str) -> None:
        self.table, self.name = table, name

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"shard {i} is outside 0..{len(self) - 1}")
        return self.table.value(self.name, i)

    def __iter__(self) -> Iterator[Any]:
        for k in range(len(self.table.parts["tables"])):
            yield from self.table.part(k)[self.name]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PartColumn({self.name!r}, {len(self)} shards)"


class Counts(Sequence[int]):
    """The sample counts of a parted manifest: a read-only int64 array that numpy takes without copying."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.values.setflags(write=False)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: Any) -> Any:
        return self.values[i].tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.values.tolist())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.values if dtype is None else self.values.astype(dtype)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and bool(np.array_equal(self.values, np.asarray(other)))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Counts({len(self)} shards, {int(self.values.sum())} samples)"


class SkippedRows(Sequence[dict[str, str]]):
    """The skipped samples of a parted manifest: their count from the root, the rows on first use."""

    def __init__(self, table: PartedTable) -> None:
        self.table, self.entry = table, table.parts["skipped"]
        self._rows: list[dict[str, str]] | None = None

    def _load(self) -> list[dict[str, str]]:
        if self._rows is None:
            data, _ = read_part(self.table.store, self.table.parts, self.entry, self.table.fingerprint)
            self._rows = [{k: v for k, v in row.items() if v is not None} for row in data.to_pylist()]
        return self._rows

    def __len__(self) -> int:
        return int(self.entry.get("rows", 0))

    def __getitem__(self, i: Any) -> Any:
        return self._load()[i]

    def __iter__(self) -> Iterator[dict[str, str]]:
        return iter(self._load())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table}  # a loader worker never needs them: they load again if asked

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["table"])  # type: ignore[misc]
